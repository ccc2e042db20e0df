# Vulkan backend (edgeport-vulkan): a Vulkan loader + Mesa's drivers (lavapipe, a conformant Vulkan 1.3 device on
# the CPU, when there is no GPU), glslc to compile the GLSL compute shaders to SPIR-V when the package builds, and
# spirv-val to validate them. Then the editable install, which runs that build step.
vulkan_apt=""
for pkg in mesa-vulkan-drivers libvulkan1 glslc spirv-tools; do
  dpkg -s "$pkg" >/dev/null 2>&1 || vulkan_apt="$vulkan_apt $pkg"
done
if [ -n "$vulkan_apt" ]; then
  $SUDO apt-get update -q
  # shellcheck disable=SC2086
  $SUDO apt-get install -y -q $vulkan_apt
fi
unset vulkan_apt
# Re-installing also recompiles changed shaders (setup.py only rebuilds a .spv older than its .comp).
if ! "$VENV/bin/python" -c "import edgeport_vulkan, vulkan" >/dev/null 2>&1 \
   || [ -n "$(find backends-vulkan/src/edgeport_vulkan/shaders -name '*.comp' \
                -newer backends-vulkan/src/edgeport_vulkan/spirv/fill.spv 2>/dev/null)" ] \
   || [ ! -f backends-vulkan/src/edgeport_vulkan/spirv/fill.spv ]; then
  $PIP install -e ./backends-vulkan
fi
"$VENV/bin/pip" check
