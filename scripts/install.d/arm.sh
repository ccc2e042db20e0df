# Arm backends (TOSABackend, EthosUBackend): Arm's tosa-tools (TOSA serializer + reference model) and Vela come in
# as edgeport-arm's dependencies. tosa-tools pins numpy<2.2 and flatbuffers==25.2.10; pip resolves the venv to them.
if ! "$VENV/bin/python" -c "import edgeport_arm, tosa_reference_model, ethosu.vela" >/dev/null 2>&1; then
  $PIP install -e ./backends-arm
fi
"$VENV/bin/pip" check
