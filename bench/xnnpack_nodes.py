"""XNNPACK per node kind: single-node and few-node models, edgeport vs ExecuTorch 1.5.1, 1 and 2 threads.

Each model is one node kind of MobileNetV2 or of the transformer encoder (the conv shape classes of MobileNetV2 --
the 3x3 stride-2 stem, depthwise 3x3 stride 1 and 2, pointwise expand and project -- its fully-connected head,
add, hardtanh, mean; the encoder's QKV / FFN fully-connected layers, layer norm, softmax, GELU), exported once and
lowered twice: ExecuTorch's ``to_edge_transform_and_lower`` + its ``XnnpackPartitioner`` run on
``executorch.runtime`` (its threadpool reset to N), and edgeport's with ``XnnpackCompileOptions(num_threads=N)`` on
``edgeport.runtime``. Outputs are checked against eager first. Timing: ``xnnpack_bench.timing.interleaved`` (every
repetition visits all contenders in a rotated order, a 20 ms gap before each; the warm call is reported), per thread count. The ratio column is edgeport / ExecuTorch medians: where it is far from 1,
that node kind carries the gap. The CPU model and its SIMD flags are printed with the table: AVX2-only and AVX-512
hosts give different ratios.

Eager PyTorch is timed too (``torch.set_num_threads(N)``), for the encoder goal (edgeport <= 1.0x eager).

``--emulate-avx2`` runs the same measurement as on an AVX2-only CPU of this microarchitecture, as far as it can be
emulated: edgeport's libXNNPACK through a small library that clears every AVX-512 flag of the Debian libcpuinfo it
links (``xnnpack_bench/avx2_only.c``, built here with gcc, needs ``libcpuinfo-dev``; loaded with ctypes so nothing
else binds to it); ExecuTorch's XNNPACK through a second one that does the same in the cpuinfo ExecuTorch's
XNNPACK imports from ``libexecutorch_threadpool.so`` (``xnnpack_bench/avx2_only_et.c``, built against PyTorch's
``cpuinfo.h``; the flags it reads back are checked against ``/proc/cpuinfo`` before it masks, and the struct it
binds to against the one ExecuTorch's library exports); PyTorch through ``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2``. edgeport's executor decides where fully-connected layers
run from the CPU it sees (``XnnpackRuntimeOptions.fully_connected``, "auto"), which the masks do not reach: in this
mode the bench passes it what "auto" picks on an AVX2-only CPU, and runs its host convolution kernel in its AVX2
form (``EDGEPORT_XNNPACK_CONV_ISA=avx2``).

    python bench/xnnpack_nodes.py [--reps 60] [--threads 1 2] [--kinds stem dw_s1 ...] [--emulate-avx2]
        [--write-report]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from xnnpack_bench.machine import cpu_model, loadavg, nproc  # noqa: E402
from xnnpack_bench.models import build_model, lower_edgeport, lower_executorch  # noqa: E402
from xnnpack_bench.timing import interleaved, rel_err  # noqa: E402

REPORT = Path(__file__).resolve().parent / "REPORT.md"
SECTION = "## XNNPACK per node kind"
EMULATED = os.environ.get("EDGEPORT_BENCH_EMULATED_ISA", "")
# idle time before each contender. 50 ms (past the ~27 ms the 2021 pthreadpool's workers spin after a call) gave
# more 2-thread cells stalled by ~4 ms on this 2-vCPU machine (5-6 rows per table, either runtime) than 20 ms (0-3)
GAP_S = 0.02
# edgeport's host convolution kernel checks the CPU itself: EDGEPORT_XNNPACK_CONV_ISA caps it at its AVX2 form
_MASK_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "EDGEPORT_XNNPACK_CONV_ISA": "avx2"}


def _models() -> dict[str, tuple[str, Callable[[], tuple[Any, tuple[Any, ...]]]]]:
    import torch
    from torch import nn

    def conv(cin: int, cout: int, k: int, s: int, groups: int, hw: int) -> Callable[[], Any]:
        return lambda: (nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False),
                                      nn.BatchNorm2d(cout), nn.ReLU6()).eval(), (torch.randn(1, cin, hw, hw),))

    class Add(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a + b

    class Mean(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean(dim=(2, 3))

    class Softmax(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(x, dim=-1)

    return {
        "stem": ("conv 3x3 s2 3->32, 224x224 (+BN, ReLU6)", conv(3, 32, 3, 2, 1, 224)),
        "dw_s1": ("depthwise 3x3 s1 C=144, 56x56 (+BN, ReLU6)", conv(144, 144, 3, 1, 144, 56)),
        "dw_s2": ("depthwise 3x3 s2 C=144, 56x56 (+BN, ReLU6)", conv(144, 144, 3, 2, 144, 56)),
        "pw_expand": ("pointwise 1x1 24->144, 56x56 (+BN, ReLU6)", conv(24, 144, 1, 1, 1, 56)),
        "pw_project": ("pointwise 1x1 144->24, 56x56 (+BN)",
                       lambda: (nn.Sequential(nn.Conv2d(144, 24, 1, bias=False), nn.BatchNorm2d(24)).eval(),
                                (torch.randn(1, 144, 56, 56),))),
        # ResNet-18's dense 3x3 convolutions (BN folded, ReLU), one per stage and the stride-2 entries
        "r3x3_64": ("conv 3x3 s1 64->64, 56x56 (+BN, ReLU6): ResNet-18 layer1", conv(64, 64, 3, 1, 1, 56)),
        "r3x3_128s2": ("conv 3x3 s2 64->128, 56x56 (+BN, ReLU6): ResNet-18 layer2 entry", conv(64, 128, 3, 2, 1, 56)),
        "r3x3_128": ("conv 3x3 s1 128->128, 28x28 (+BN, ReLU6): ResNet-18 layer2", conv(128, 128, 3, 1, 1, 28)),
        "r3x3_256": ("conv 3x3 s1 256->256, 14x14 (+BN, ReLU6): ResNet-18 layer3", conv(256, 256, 3, 1, 1, 14)),
        "r3x3_512": ("conv 3x3 s1 512->512, 7x7 (+BN, ReLU6): ResNet-18 layer4", conv(512, 512, 3, 1, 1, 7)),
        "r7x7_stem": ("conv 7x7 s2 3->64, 224x224 (+BN, ReLU6): ResNet-18 stem", conv(3, 64, 7, 2, 1, 224)),
        "resnet18": ("ResNet-18 224 fp32 (bench/xnnpack.py's)", lambda: build_model("resnet18")),
        "fc_head": ("linear 1280->1000, batch 1", lambda: (nn.Linear(1280, 1000).eval(), (torch.randn(1, 1280),))),
        "add": ("add 1x24x56x56", lambda: (Add().eval(), (torch.randn(1, 24, 56, 56), torch.randn(1, 24, 56, 56)))),
        "hardtanh": ("hardtanh 1x144x56x56", lambda: (nn.Hardtanh(0, 6).eval(), (torch.randn(1, 144, 56, 56),))),
        "mean": ("mean over H,W 1x1280x7x7", lambda: (Mean().eval(), (torch.randn(1, 1280, 7, 7),))),
        "enc_qkv": ("linear 256->768, 128 tokens", lambda: (nn.Linear(256, 768).eval(), (torch.randn(1, 128, 256),))),
        "enc_ffn1": ("linear 256->1024 + ReLU, 128 tokens",
                     lambda: (nn.Sequential(nn.Linear(256, 1024), nn.ReLU()).eval(), (torch.randn(1, 128, 256),))),
        "enc_ffn2": ("linear 1024->256, 128 tokens",
                     lambda: (nn.Linear(1024, 256).eval(), (torch.randn(1, 128, 1024),))),
        "layer_norm": ("layer norm 128x256", lambda: (nn.LayerNorm(256).eval(), (torch.randn(1, 128, 256),))),
        "softmax": ("softmax 8x128x128", lambda: (Softmax().eval(), (torch.randn(1, 8, 128, 128),))),
        "gelu": ("GELU 128x1024", lambda: (nn.GELU().eval(), (torch.randn(1, 128, 1024),))),
        "encoder": ("nn.TransformerEncoder 4 x (d 256, 8 heads, ffn 1024), 1x128 tokens",
                    lambda: (nn.TransformerEncoder(nn.TransformerEncoderLayer(256, 8, 1024, dropout=0.0,
                                                                              batch_first=True), 4,
                                                   enable_nested_tensor=False).eval(),
                             (torch.randn(1, 128, 256),))),
        # whole CNNs, built and lowered as bench/xnnpack.py does (int8: each side's own XNNPACK quantizer)
        "mobilenet_v2": ("MobileNetV2 224 fp32 (bench/xnnpack.py's)", lambda: build_model("mobilenet_v2")),
        "mobilenet_v2_int8": ("MobileNetV2 224 int8, per-channel weights (each side's XNNPACK quantizer)",
                              lambda: build_model("mobilenet_v2_int8")),
    }


def _flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                wanted = re.compile(r"^(avx\w*|fma|f16c|amx\w*|sse4_\d)$")
                return " ".join(f for f in line.split(":", 1)[1].split() if wanted.match(f))
    except OSError:
        pass
    return "n/a"


def _lower(kind: str, model: Any, inputs: tuple[Any, ...], threads: int) -> tuple[bytes, bytes]:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as EtPartitioner
    from executorch.exir import to_edge_transform_and_lower as et_lower

    import edgeport
    from edgeport_xnnpack import XnnpackCompileOptions, XnnpackPartitioner

    if kind.startswith("mobilenet_v2") or kind == "resnet18":
        return lower_executorch(kind, model, inputs, use_cache=False), lower_edgeport(kind, model, inputs, threads)
    ep = torch.export.export(model, inputs)
    et = et_lower(ep, partitioner=[EtPartitioner()]).to_executorch().buffer
    ours = edgeport.to_edge_transform_and_lower(
        ep, partitioner=[XnnpackPartitioner(XnnpackCompileOptions(num_threads=threads))]).to_executorch().buffer
    return et, ours


def fc_choice(option: str) -> str:
    """What edgeport's executor runs fully-connected layers and 1x1 convolutions with: ``option``, with "auto"
    resolved for the CPU being measured (in ``--emulate-avx2`` mode: this CPU without its AVX-512 flags)."""
    from edgeport_xnnpack._host_gemm import choice_for, cpu_flags, resolve

    if option != "auto":
        return option
    flags = cpu_flags()
    if EMULATED:
        flags = {f for f in flags if not f.startswith("avx512")}
    return choice_for(resolve("auto", flags))


def measure(kind: str, threads: int, reps: int, fully_connected: str = "xnnpack") -> dict[str, Any]:
    import torch
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime as EtRuntime

    from edgeport.runtime import Runtime

    torch.manual_seed(0)
    label, build = _models()[kind]
    model, inputs = build()
    et_pte, ep_pte = _lower(kind, model, inputs, threads)
    if portable_lib._threadpool_get_thread_count() != threads:
        portable_lib._unsafe_reset_threadpool(threads)
    et = EtRuntime.get().load_program(et_pte).load_method("forward")
    ours = Runtime.get().load_program(ep_pte).load_method(
        "forward", backend_options={"XnnpackBackend": {"fully_connected": fully_connected}})
    x_t, x_np = list(inputs), [t.numpy().copy() for t in inputs]
    torch.set_num_threads(threads)
    with torch.no_grad():
        ref = model(*inputs).numpy()
    errors = (rel_err(et.execute(x_t)[0].numpy(), ref), rel_err(ours.execute(x_np)[0], ref))

    def eager() -> Any:
        with torch.no_grad():
            return model(*inputs)

    times = interleaved({"executorch": lambda: et.execute(x_t), "edgeport": lambda: ours.execute(x_np),
                         "eager": eager}, reps=reps, gap_s=GAP_S, warmup=5)
    med = {k: statistics.median(v[1]) for k, v in times.items()}
    low = {k: min(v[1]) for k, v in times.items()}  # under other processes' load, the steadier comparison
    return {"kind": kind, "label": label, "threads": threads, "fc": fully_connected, "et_ms": med["executorch"] * 1e3,
            "ep_ms": med["edgeport"] * 1e3, "eager_ms": med["eager"] * 1e3,
            "et_min_ms": low["executorch"] * 1e3, "ep_min_ms": low["edgeport"] * 1e3,
            "ratio_min": low["edgeport"] / low["executorch"], "load": loadavg(),
            "ratio": med["edgeport"] / med["executorch"], "ratio_eager": med["edgeport"] / med["eager"],
            "err_et": errors[0], "err_ep": errors[1]}


BUSY_NOTE = ("**One core busy** (`--busy-core`): another process spins on the CPU for the whole run, as when a "
             "device does other work; the 2-thread columns show what each thread pool does when one of its workers "
             "competes for a core. ")
BUSY = False  # --busy-core: another process keeps one core busy while the contenders are timed


def section_title() -> str:
    return SECTION + (" (AVX2 emulated)" if EMULATED else " (host ISA)") + (", one core busy" if BUSY else "")


def render(rows: list[dict[str, Any]], threads: list[int]) -> str:
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    mode = ("**AVX2 emulated** (`--emulate-avx2`): edgeport's libXNNPACK, ExecuTorch's XNNPACK and PyTorch see "
            "no AVX-512 (each through the cpuinfo or the switches it reads; see the script's docstring). "
            if EMULATED else "Host ISA. ")
    fcs = sorted({r["fc"] for r in rows})
    mode += (f"edgeport's executor ran fully-connected layers and 1x1 convolutions with `fully_connected=` "
             f"{', '.join(repr(f) for f in fcs)} (`XnnpackRuntimeOptions`; \"auto\" resolved for this CPU: "
             "\"host-float\" = float32 ones on edgeport's AVX2 kernel, \"host-int8\" = int8 ones on its VNNI kernel, "
             "\"xnnpack\" = all in libXNNPACK). ")
    lines = [section_title(), "",
             f"Measured by `bench/xnnpack_nodes.py` on {now}: {nproc()} CPUs, {cpu_model()} (flags: {_flags()}); "
             f"load average at the end {loadavg()}. {mode}{BUSY_NOTE if BUSY else ''}Warm-call medians, the three contenders interleaved; "
             "ratio = edgeport / ExecuTorch and edgeport / eager (below 1: edgeport faster). error = max |out - "
             "eager| / max |eager|.", "",
             "| node kind | model | " + " | ".join(
                 f"ET ms ({t}t) | edgeport ms ({t}t) | eager ms ({t}t) | ep/ET ({t}t) | ep/eager ({t}t)"
                 for t in threads) + " | error ET / edgeport |",
             "|---|---|" + "---:|---:|---:|---:|---:|" * len(threads) + "---|"]
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    for kind in kinds:
        cells = []
        err = ""
        label = ""
        for t in threads:
            r = next((r for r in rows if r["kind"] == kind and r["threads"] == t), None)
            if r is None:
                cells += ["-"] * 5
                continue
            label = r["label"]
            err = f"{r['err_et']:.1e} / {r['err_ep']:.1e}"
            cells += [f"{r['et_ms']:.3f}", f"{r['ep_ms']:.3f}", f"{r['eager_ms']:.3f}",
                      f"**{r['ratio']:.2f}x**" if r["ratio"] > 1.25 else f"{r['ratio']:.2f}x",
                      f"**{r['ratio_eager']:.2f}x**" if r["ratio_eager"] > 1.0 else f"{r['ratio_eager']:.2f}x"]
        lines.append(f"| `{kind}` | {label} | " + " | ".join(cells) + f" | {err} |")
    return "\n".join(lines) + "\n"


def write_report(body: str) -> None:
    text = REPORT.read_text() if REPORT.exists() else "# Benchmarks\n"
    title = section_title()
    start = text.find(title + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + body
    else:
        nxt = text.find("\n## ", start + len(title))
        end = len(text) if nxt < 0 else nxt + 1
        text = text[:start] + body + ("\n" if nxt >= 0 else "") + text[end:]
    REPORT.write_text(text)


def _et_paths() -> tuple[Path, Path]:
    """(PyTorch's include directory, ExecuTorch's lib directory), found without importing either."""
    import importlib.util

    torch_spec, et_spec = importlib.util.find_spec("torch"), importlib.util.find_spec("executorch")
    if torch_spec is None or et_spec is None or not torch_spec.submodule_search_locations \
            or not et_spec.submodule_search_locations:
        sys.exit("--emulate-avx2 needs torch and executorch installed")
    return (Path(list(torch_spec.submodule_search_locations)[0]) / "include",
            Path(list(et_spec.submodule_search_locations)[0]) / "lib")


def _reexec_emulated(argv: list[str]) -> None:
    """Build the two cpuinfo shims and run this script again with PyTorch masked to AVX2 (the shims are loaded
    by the new process, see ``_mask_xnnpacks``)."""
    if not Path("/usr/include/cpuinfo.h").exists() or shutil.which("gcc") is None:
        sys.exit("--emulate-avx2 needs gcc and Debian's libcpuinfo-dev (apt-get install gcc libcpuinfo-dev)")
    here = Path(__file__).resolve().parent / "xnnpack_bench"
    from xnnpack_bench.settings import CACHE

    out, out_et = CACHE / "avx2_only.so", CACHE / "avx2_only_et.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(out), str(here / "avx2_only.c"),
                    "-l:libcpuinfo.so.0"], check=True)
    include, et_lib = _et_paths()
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-I", str(include), "-o", str(out_et),
                    str(here / "avx2_only_et.c"), "-L", str(et_lib), "-l:libexecutorch_threadpool.so",
                    f"-Wl,-rpath,{et_lib}"], check=True)
    env = dict(os.environ, EDGEPORT_BENCH_EMULATED_ISA=f"{out}:{out_et}", **_MASK_ENV)
    args = [a for a in argv if a != "--emulate-avx2"]
    os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *args], env)


_ISA_BITS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512vl")  # avx2_only_et.c


def _mask_xnnpacks(shims: str) -> None:
    """Clear AVX-512 in the cpuinfo each XNNPACK will use, before either is initialized.

    edgeport's: the shim brings in Debian's libcpuinfo.so.0, and libXNNPACK.so.0, loaded later, binds to that same
    instance. ExecuTorch's: the shim loads ExecuTorch's libexecutorch_threadpool.so and masks its cpuinfo before
    ``import executorch.runtime`` loads the XNNPACK backend (which binds to that loaded instance: checked after);
    the flags the shim reads must be this CPU's, or nothing is masked."""
    import ctypes

    ours, theirs = shims.split(":")
    if "edgeport_xnnpack.native" in sys.modules:
        sys.exit("--emulate-avx2: edgeport's XNNPACK was loaded before the mask")
    if ctypes.CDLL(ours).edgeport_mask_avx512() != 1:
        sys.exit("--emulate-avx2: could not mask AVX-512 in libcpuinfo (does this CPU have AVX2?)")
    shim = ctypes.CDLL(theirs, mode=ctypes.RTLD_LOCAL)  # loads ExecuTorch's libexecutorch_threadpool.so
    flags = set(Path("/proc/cpuinfo").read_text().split("\nflags", 1)[1].split("\n", 1)[0].split())
    bits = shim.edgeport_et_isa()
    read = {name for i, name in enumerate(_ISA_BITS) if bits >= 0 and bits >> i & 1}
    want = {name for name in _ISA_BITS if name in flags}
    if read != want:
        sys.exit(f"--emulate-avx2: ExecuTorch's cpuinfo reads {sorted(read)} through PyTorch's cpuinfo.h, the CPU "
                 f"has {sorted(want)}: the struct layouts differ, not masking")
    if shim.edgeport_et_mask_avx512() != 1:
        sys.exit("--emulate-avx2: could not mask AVX-512 in ExecuTorch's cpuinfo")
    import executorch.runtime  # noqa: F401 - loads ExecuTorch's XNNPACK, which must bind to the masked cpuinfo

    tp = ctypes.CDLL(str(_et_paths()[1] / "libexecutorch_threadpool.so"), mode=os.RTLD_NOLOAD | ctypes.RTLD_LOCAL)
    shim.edgeport_et_isa_address.restype = ctypes.c_void_p
    if shim.edgeport_et_isa_address() != ctypes.addressof(ctypes.c_char.in_dll(tp, "cpuinfo_isa")):
        sys.exit("--emulate-avx2: the ExecuTorch shim bound to another cpuinfo than ExecuTorch's XNNPACK uses")


def main(argv: list[str] | None = None) -> None:
    raw = list(sys.argv[1:] if argv is None else argv)
    if "--emulate-avx2" in raw and not EMULATED:
        _reexec_emulated(raw)
    if EMULATED:
        _mask_xnnpacks(EMULATED)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--kinds", nargs="+", default=None, help="node kinds (default: all)")
    ap.add_argument("--emulate-avx2", action="store_true", help="mask AVX-512 from edgeport's XNNPACK and PyTorch")
    ap.add_argument("--fully-connected", choices=["auto", "xnnpack", "host", "host-float", "host-int8"],
                    default="auto",
                    help="edgeport's XnnpackRuntimeOptions.fully_connected (auto: what this CPU gets)")
    ap.add_argument("--busy-core", action="store_true",
                    help="keep one core busy with another process (a spin loop) while timing")
    ap.add_argument("--write-report", action="store_true", help="replace this section of bench/REPORT.md")
    args = ap.parse_args(argv)
    kinds = args.kinds or list(_models())
    unknown = sorted(set(kinds) - set(_models()))
    if unknown:
        ap.error(f"unknown node kinds {unknown}; known: {', '.join(_models())}")
    global BUSY
    BUSY = args.busy_core
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if BUSY else None
    fc = fc_choice(args.fully_connected)
    print(f"edgeport's fully-connected layers and 1x1 convolutions: {fc}")
    rows = []
    try:
        for t in args.threads:
            for kind in kinds:
                rows.append(measure(kind, t, args.reps, fc))
                r = rows[-1]
                print(f"{kind:12s} {t}t  ET {r['et_ms']:8.3f} ms  edgeport {r['ep_ms']:8.3f} ms  eager "
                      f"{r['eager_ms']:8.3f} ms  ep/ET {r['ratio']:.2f}  ep/eager {r['ratio_eager']:.2f}  min: ET "
                      f"{r['et_min_ms']:.3f} edgeport {r['ep_min_ms']:.3f} ms ep/ET {r['ratio_min']:.2f}  load "
                      f"{r['load']}", flush=True)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    body = render(rows, args.threads)
    print(body)
    if args.write_report:
        write_report(body)


if __name__ == "__main__":
    main()
