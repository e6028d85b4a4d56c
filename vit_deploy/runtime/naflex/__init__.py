"""SigLIP 2 NaFlex, the runtime's second input kind: each image at its own aspect ratio, fed
as patches + mask + grids instead of one NCHW tensor. contract.py (names, dims, the
metadata key; imports nothing, so the manifest knows a NaFlex bundle without Pillow),
preprocess.py (images -> those inputs, as transformers makes them), session.py
(NaFlexSession, and open_session, which picks the session a bundle's input kind needs),
references.py (the golden references of such a bundle). Apps import from
vit_deploy.runtime; this package's __init__ imports nothing, so the contract stays light.
"""
