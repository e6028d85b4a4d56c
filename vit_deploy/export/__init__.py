"""The torch side: PyTorch model -> ONNX -> simplified -> bundle. Needs the `export` extra."""
