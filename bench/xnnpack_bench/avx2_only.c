/* AVX2-host emulation for edgeport's libXNNPACK (bench/xnnpack_nodes.py --emulate-avx2).

   Loaded with LD_PRELOAD, this wraps cpuinfo_initialize() of Debian's libcpuinfo (which libXNNPACK.so.0 links
   dynamically) and clears every AVX-512 flag of cpuinfo_isa afterwards, so XNNPACK's kernel dispatch picks what it
   would pick on an AVX2-only CPU of the same microarchitecture. ExecuTorch's XNNPACK is linked statically into its
   pybindings with its own cpuinfo, so it cannot be masked this way; PyTorch is masked by environment variables
   (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS). Build:
   gcc -O2 -shared -fPIC -o avx2_only.so avx2_only.c -ldl -l:libcpuinfo.so.0   (needs libcpuinfo-dev) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <cpuinfo.h>

bool cpuinfo_initialize(void) {
    static bool (*real)(void) = 0;
    if (!real) real = (bool (*)(void))dlsym(RTLD_NEXT, "cpuinfo_initialize");
    bool ok = real();
    cpuinfo_isa.avx512f = cpuinfo_isa.avx512pf = cpuinfo_isa.avx512er = cpuinfo_isa.avx512cd = false;
    cpuinfo_isa.avx512dq = cpuinfo_isa.avx512bw = cpuinfo_isa.avx512vl = cpuinfo_isa.avx512ifma = false;
    cpuinfo_isa.avx512vbmi = cpuinfo_isa.avx512vbmi2 = cpuinfo_isa.avx512bitalg = false;
    cpuinfo_isa.avx512vpopcntdq = cpuinfo_isa.avx512vnni = cpuinfo_isa.avx512bf16 = false;
    cpuinfo_isa.avx512vp2intersect = cpuinfo_isa.avx512_4vnniw = cpuinfo_isa.avx512_4fmaps = false;
    return ok;
}
