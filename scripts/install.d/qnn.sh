# Qualcomm QNN backend (edgeport-qnn). Its [htp] extra pulls onnxruntime-qnn==2.7.0, whose wheel ships Qualcomm's
# QAIRT 2.51 host libraries (libQnnHtp.so runs the HTP kernels in an emulator on x86). Those libraries are used
# where pip installs them, never copied into the repository. Sourced by scripts/install.sh (VENV, PIP, SUDO set).
if ! "$VENV/bin/python" -c "import edgeport_qnn, importlib.util as u, sys; sys.exit(u.find_spec('onnxruntime_qnn') is None)" >/dev/null 2>&1; then
  $PIP install -e "./backends-qnn[htp]"
fi
"$VENV/bin/pip" check
