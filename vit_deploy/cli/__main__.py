"""python -m vit_deploy.cli: the `vit-deploy` console script."""

from vit_deploy.cli import main

if __name__ == "__main__":
    main()
