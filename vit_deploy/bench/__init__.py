"""`vit-deploy bench`: the provider / precision comparison, its report, floors, saved reports compared."""
