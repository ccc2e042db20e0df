# Developer tools (edgeport.devtools.graph_view, `edgeport view`): Debian's chromium, the headless browser the
# graph report's tests render the page in (those tests skip, saying why, without it); Pillow, to read the
# screenshot; and Google's Model Explorer (ai-edge-model-explorer), whose graph format the report exports and whose
# loader the tests check it with. ExecuTorch's Model Explorer adapters (executorch-extension-model-explorer) are
# not installed: they need flatbuffers>=25.12, and the project tests flatbuffers 25.2.10 (docs/devtools-graph-view.md).
if ! command -v chromium >/dev/null 2>&1; then
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
fi
"$VENV/bin/python" -c "import PIL" >/dev/null 2>&1 || $PIP install pillow
"$VENV/bin/python" -c "import model_explorer" >/dev/null 2>&1 || $PIP install ai-edge-model-explorer
"$VENV/bin/pip" check
