"""No usage telemetry from any process poolwire starts (docs/SECURITY.md). Applied by
`import poolwire`, before poolwire imports any library that reads these switches.

- huggingface_hub (and transformers through it) read HF_HUB_DISABLE_TELEMETRY, and the
  generic DO_NOT_TRACK, once, when huggingface_hub.constants is imported. Set with setdefault:
  an operator's own value stands.
- OpenVINO's model converter reports to Google Analytics through the `openvino-telemetry`
  package, on by default when no consent file exists, in a forked child that a stopped worker
  could leave behind (issue 25). That package has no environment switch; its documented opt-out
  (`opt_in_out --opt_out`) writes ~/intel/openvino_telemetry and itself posts an opt-out event.
  OpenVINO's converter imports the package under `try`, using the no-op stub it ships
  (openvino/tools/ovc/telemetry_stub.py) when the import fails; marking the module absent in
  sys.modules makes that import fail in this process, so the stub is what runs: no consent
  file, no client id, no child, no network."""

import os
import sys

ENVIRONMENT = {"HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1"}
OPENVINO_TELEMETRY_MODULE = "openvino_telemetry"


def apply(environ=os.environ, modules=sys.modules) -> None:
    for name, value in ENVIRONMENT.items():
        environ.setdefault(name, value)
    # setdefault: where the host program imported it already, its choice stands.
    modules.setdefault(OPENVINO_TELEMETRY_MODULE, None)
