# Qualcomm QNN backend (edgeport-qnn). Its [htp] extra pulls onnxruntime-qnn==2.7.0, whose wheel ships Qualcomm's
# QAIRT 2.51 host libraries (libQnnHtp.so runs the HTP kernels in an emulator on x86). Those libraries are used
# where pip installs them, never copied into the repository. Sourced by scripts/install.sh (VENV, PIP, SUDO set).
if ! "$VENV/bin/python" -c "import edgeport_qnn, importlib.util as u, sys; sys.exit(u.find_spec('onnxruntime_qnn') is None)" >/dev/null 2>&1; then
  $PIP install -e "./backends-qnn[htp]"
fi
# Test-only: onnx, to export the ONNX models of backends-qnn/tests/test_ort_oracle.py and bench/qnn.py (the oracle is
# ONNX Runtime's QNN EP from the same wheel). onnx 1.21.0: newer releases want a newer ml-dtypes than tosa-tools pins (0.5.3).
if ! "$VENV/bin/python" -c "import onnx" >/dev/null 2>&1; then
  $PIP install "onnx==1.21.0"
fi
"$VENV/bin/pip" check
