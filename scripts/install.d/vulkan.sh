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
# Re-installing also recompiles changed shaders (setup.py rebuilds each .spv older than its .comp).
vulkan_stale=""
for comp in backends-vulkan/src/edgeport_vulkan/shaders/*.comp; do
  spv="backends-vulkan/src/edgeport_vulkan/spirv/$(basename "${comp%.comp}")"
  { [ "$spv.spv" -nt "$comp" ] && [ "${spv}_fp16.spv" -nt "$comp" ]; } || vulkan_stale=1
done
if [ -n "$vulkan_stale" ] || ! "$VENV/bin/python" -c "import edgeport_vulkan, vulkan" >/dev/null 2>&1; then
  $PIP install -e ./backends-vulkan
fi
unset vulkan_stale comp spv
"$VENV/bin/pip" check
