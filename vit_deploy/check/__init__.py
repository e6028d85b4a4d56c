"""`vit-deploy check`: PyTorch (or the golden references) against every provider x precision x size."""
