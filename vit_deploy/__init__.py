"""vit-deploy: a Vision Transformer from PyTorch to the edge (docs/index.md).

Nothing sent: ONNX Runtime's official wheels collect telemetry (an event store under
~/.cache/Microsoft/DeveloperTools/, uploaded when a network is there) from the moment the
library loads, unless ORT_DISABLE_TELEMETRY is set then. Every entry point (the CLI, the
runtime imported as a library, the servers and the processes they start) imports this
package first, so it is set here, before any of our modules can load ONNX Runtime.
Opt in with VIT_DEPLOY_ORT_TELEMETRY=1 (docs/guarantees.md).
"""

import os as _os
import sys as _sys

ORT_TELEMETRY_OPT_IN = "VIT_DEPLOY_ORT_TELEMETRY"

if _os.environ.get(ORT_TELEMETRY_OPT_IN) != "1":
    _os.environ["ORT_DISABLE_TELEMETRY"] = "1"  # read by ONNX Runtime when it loads
    if "onnxruntime" in _sys.modules:  # loaded before us: stop what still can be stopped
        try:
            _sys.modules["onnxruntime"].disable_telemetry_events()
        except Exception:  # an ONNX Runtime without the call, or a stand-in module
            pass
