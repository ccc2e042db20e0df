/* AVX2-host emulation for edgeport's libXNNPACK (bench/xnnpack_nodes.py --emulate-avx2).

   edgeport_mask_avx512() initializes Debian's libcpuinfo (the one libXNNPACK.so.0 links dynamically) and clears
   every AVX-512 flag of its cpuinfo_isa, so XNNPACK's kernel dispatch picks what it would pick on an AVX2-only CPU
   of the same microarchitecture (cpuinfo_initialize runs once; xnn_initialize's later call changes nothing). Load
   it with ctypes (RTLD_LOCAL) before edgeport's XNNPACK is initialized: it then binds to the same libcpuinfo
   instance as libXNNPACK and to nothing else. Not an LD_PRELOAD shim on purpose: a preloaded libcpuinfo would also
   replace the cpuinfo that ExecuTorch's XNNPACK and PyTorch import dynamically, with a struct layout of another
   version. Build: gcc -O2 -shared -fPIC -o avx2_only.so avx2_only.c -l:libcpuinfo.so.0  (needs libcpuinfo-dev) */
#include <stdbool.h>
#include <cpuinfo.h>

int edgeport_mask_avx512(void) {
    if (!cpuinfo_initialize())
        return 0;
    cpuinfo_isa.avx512f = cpuinfo_isa.avx512pf = cpuinfo_isa.avx512er = cpuinfo_isa.avx512cd = false;
    cpuinfo_isa.avx512dq = cpuinfo_isa.avx512bw = cpuinfo_isa.avx512vl = cpuinfo_isa.avx512ifma = false;
    cpuinfo_isa.avx512vbmi = cpuinfo_isa.avx512vbmi2 = cpuinfo_isa.avx512bitalg = false;
    cpuinfo_isa.avx512vpopcntdq = cpuinfo_isa.avx512vnni = cpuinfo_isa.avx512bf16 = false;
    cpuinfo_isa.avx512vp2intersect = cpuinfo_isa.avx512_4vnniw = cpuinfo_isa.avx512_4fmaps = false;
    return cpuinfo_has_x86_avx2() && !cpuinfo_has_x86_avx512f() ? 1 : 0;
}
