# Core ML backend (CoreMLBackend): Apple's coremltools 9.0 comes in as edgeport-coreml's dependency (it has no torch
# requirement and keeps the venv's numpy 2.1.3 / flatbuffers 25.2.10 / torch 2.13.0). Lowering runs everywhere;
# executing a Core ML delegate needs macOS 13+ (coremltools' MLModel.predict refuses elsewhere).
if ! "$VENV/bin/python" -c "import edgeport_coreml, coremltools" >/dev/null 2>&1; then
  $PIP install -e ./backends-coreml
fi
"$VENV/bin/pip" check
