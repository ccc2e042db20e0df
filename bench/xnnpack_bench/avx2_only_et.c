/* AVX2-host emulation for ExecuTorch's XNNPACK (bench/xnnpack_nodes.py --emulate-avx2).

   ExecuTorch 1.5.1's libexecutorch_backend_xnnpack.so does not carry its own cpuinfo: it imports cpuinfo_isa and
   cpuinfo_initialize from libexecutorch_threadpool.so. Built against PyTorch's cpuinfo.h (a cpuinfo of the same
   generation; the bench checks that the struct reads back this CPU's flags before it masks anything) and linked to
   that library, edgeport_et_mask_avx512() clears every AVX-512 flag there, so ExecuTorch's XNNPACK, initialized
   later (when its first program loads), dispatches as on an AVX2-only CPU of this microarchitecture.
   edgeport_et_isa() reports flags as read through this header's layout (bit 0 avx, 1 avx2, 2 fma3, 3 f16c,
   4 avx512f, 5 avx512bw, 6 avx512vnni, 7 avx512vl); edgeport_et_isa_address() the struct this library binds to.
   Build: gcc -O2 -shared -fPIC -I TORCH/include -o avx2_only_et.so avx2_only_et.c -L ETLIB
          -l:libexecutorch_threadpool.so -Wl,-rpath,ETLIB */
#include <stdbool.h>
#include <cpuinfo.h>

int edgeport_et_isa(void) {
    if (!cpuinfo_initialize())
        return -1;
    return (int)cpuinfo_isa.avx | (int)cpuinfo_isa.avx2 << 1 | (int)cpuinfo_isa.fma3 << 2 | (int)cpuinfo_isa.f16c << 3
         | (int)cpuinfo_isa.avx512f << 4 | (int)cpuinfo_isa.avx512bw << 5 | (int)cpuinfo_isa.avx512vnni << 6
         | (int)cpuinfo_isa.avx512vl << 7;
}

const void *edgeport_et_isa_address(void) { return &cpuinfo_isa; }

int edgeport_et_mask_avx512(void) {
    if (!cpuinfo_initialize())
        return 0;
    cpuinfo_isa.avx512f = cpuinfo_isa.avx512pf = cpuinfo_isa.avx512er = cpuinfo_isa.avx512cd = false;
    cpuinfo_isa.avx512dq = cpuinfo_isa.avx512bw = cpuinfo_isa.avx512vl = cpuinfo_isa.avx512ifma = false;
    cpuinfo_isa.avx512vbmi = cpuinfo_isa.avx512vbmi2 = cpuinfo_isa.avx512bitalg = false;
    cpuinfo_isa.avx512vpopcntdq = cpuinfo_isa.avx512vnni = cpuinfo_isa.avx512bf16 = false;
    cpuinfo_isa.avx512fp16 = cpuinfo_isa.avx512vp2intersect = false;
    cpuinfo_isa.avx512_4vnniw = cpuinfo_isa.avx512_4fmaps = false;
    cpuinfo_isa.avx10_1 = cpuinfo_isa.avx10_2 = cpuinfo_isa.amx_bf16 = cpuinfo_isa.amx_tile = false;
    cpuinfo_isa.amx_int8 = cpuinfo_isa.amx_fp16 = false;
    return cpuinfo_isa.avx2 && !cpuinfo_isa.avx512f ? 1 : 0;
}
