"""The quantize step: add precisions to a bundle (quantise, judge on photographs, search a recipe, rewrite)."""
