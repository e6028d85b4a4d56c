"""`vit-deploy target`: fixed-shape bucket graphs per edge target, checked, written; ORT's own tools on them."""
