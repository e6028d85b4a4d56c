"""SigLIP 2 NaFlex export: model.py (the reference model on patches + mask + grids, and its
ONNX graph), bundle.py (that graph judged against PyTorch and written as a bundle)."""
