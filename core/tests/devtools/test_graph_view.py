"""edgeport view (graph_view): the report's graph, memory timeline, timings and exports, checked against
independent oracles: the lowered FX graph's data dependencies and the partitioner's rejections, ExecuTorch's
memory profiler on ExecuTorch's own program, Model Explorer's graph classes, and a real headless browser."""

from __future__ import annotations

import argparse
import base64
import json
import operator
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.devtools.graph_view import GraphReport, configure_view_command, run_view_command
from edgeport.testing.models import transformer_encoder_layer

example = pytest.importorskip("edgeport_example")
CHROMIUM = shutil.which("chromium")


def _tiny_bert():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16)
    torch.manual_seed(0)
    return transformers.BertModel(cfg).eval(), (torch.randint(0, 64, (1, 8)),)


@pytest.fixture(scope="module")
def lowered():
    """A tiny Hugging Face BERT (random weights) partly delegated to ExampleBackend: several partitions, many
    rejected nodes."""
    model, inputs = _tiny_bert()
    partitioner = example.ExamplePartitioner()
    manager = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[partitioner])
    return manager, manager.to_executorch(), partitioner, inputs


@pytest.fixture(scope="module")
def report(lowered):
    manager, et, partitioner, _ = lowered
    return GraphReport.from_manager(manager, partitioners=[partitioner], executorch_manager=et,
                                    validation={0: {"max_abs": 1.5e-7, "sqnr_db": 131.0}}, title="tiny BERT")


def _source_nodes(node):
    """The nodes whose values ``node`` reads, through getitem, skipping weights and out= buffers."""
    found = []
    for inp in node.all_input_nodes:
        while inp.op == "call_function" and inp.target is operator.getitem:
            inp = inp.args[0]
        found.append(inp)
    return found


def test_edges_are_the_lowered_graphs_data_dependencies(lowered, report):
    manager, et, _, _ = lowered
    g = report.graph
    assert not g.notes, g.notes
    ep = et.exported_program()
    user_inputs = list(ep.graph_signature.user_inputs)
    step_of = {n.name: n.id for n in g.nodes if n.name}
    emitting = [n for n in ep.graph.nodes if n.name in step_of]
    assert len(emitting) == len(g.steps), "every instruction is named after its graph node"
    preds = {}
    for src, dst, _ in g.edges:
        preds.setdefault(dst, set()).add(src)
    for node in emitting:
        expected = set()
        for src in _source_nodes(node):
            if src.op == "placeholder" and src.name in user_inputs:
                expected.add(f"in{user_inputs.index(src.name)}")
            elif src.name in step_of:
                expected.add(step_of[src.name])
        assert preds.get(step_of[node.name], set()) == expected, node.name
    delegate_calls = [n for n in manager.exported_program().graph.nodes if "call_delegate" in str(n.target)]
    assert len(g.partitions) == len(delegate_calls) > 1
    assert {p.backend for p in g.partitions} == {"ExampleBackend"}
    assert all(p.node_count and sum(p.ops.values()) == p.node_count for p in g.partitions)


def test_rejected_nodes_carry_the_partitioners_reasons(lowered, report):
    manager, _, partitioner, _ = lowered
    remaining = {n.name for n in manager.exported_program().graph.nodes if n.op == "call_function"}
    expected = {name: why for name, why in partitioner.rejections.items() if name in remaining}
    assert expected and {k: v["reason"] for k, v in report.graph.rejected.items()} == expected
    by_name = {n.name: n for n in report.graph.nodes if n.name}
    shown = [name for name in expected if name in by_name]
    assert shown and all(by_name[name].rejected == expected[name] for name in shown)
    assert any("bert" in by_name[name].module.lower() for name in shown), "module paths come from nn_module_stack"
    assert any(".py" in by_name[name].source for name in shown), "source lines come from stack_trace"


def test_validation_and_timings_attach_to_partitions(lowered, report, tmp_path):
    _, et, _, inputs = lowered
    assert report.graph.partitions[0].validation == {"max_abs": 1.5e-7, "sqnr_db": 131.0}
    from edgeport.runtime import Runtime

    program = Runtime.get().load_program(et.buffer, enable_etdump=True)
    method = program.load_method("forward")
    for _ in range(2):
        method.execute([inputs[0].numpy()])
    program.write_etdump_result_to_file(str(tmp_path / "run.etdp"))
    timed = GraphReport.from_pte(et.buffer, etdump=str(tmp_path / "run.etdp"))
    steps = [n for n in timed.graph.nodes if n.step >= 0]
    untimed = [n for n in steps if n.time_us is None]
    # instructions the runtime folded at load (inputs are constants) or fused into another op's do not run on
    # their own, so have no time
    assert len(untimed) == method.profile.folded_instructions + method.profile.fused_calls < len(steps)
    assert all(n.time_us > 0 for n in steps if n not in untimed)
    assert all(n.kind == "kernel" for n in untimed)
    assert all(p.time_us == timed.graph.node(p.nodes[0]).time_us for p in timed.graph.partitions)

    plain = Runtime.get().load_program(et.buffer).load_method("forward")
    plain.time_ops = True
    plain.execute([inputs[0].numpy()])
    profiled = GraphReport.from_pte(et.buffer, profile=plain.profile)
    assert all(p.calls == 1 and p.time_us > 0 for p in profiled.graph.partitions)
    assert "delegate 0: ExampleBackend" in profiled.graph.op_times

    class Result:  # the shape of edgeport.devtools.validate's ValidationReport.to_dict()
        def to_dict(self):
            return {"passed": False, "whole_program": {"max_abs": 0.5, "sqnr_db": 20.0, "passed": False},
                    "partitions": [{"index": 3, "backend_id": "ExampleBackend", "ops": {"aten.add.Tensor": 1},
                                    "max_abs": 0.5, "sqnr_db": 20.0, "passed": False, "error": None}]}

    checked = GraphReport.from_pte(et.buffer, validation=Result()).graph
    assert checked.partitions[3].validation == {"backend_id": "ExampleBackend", "max_abs": 0.5, "sqnr_db": 20.0,
                                                "passed": False}
    assert any("whole program" in note and "sqnr_db 20.0" in note for note in checked.notes)
    assert GraphReport.from_pte(et.buffer, validation={"2": {"sqnr_db": 99.0}}).graph.partitions[2].validation == {
        "sqnr_db": 99.0}
    with pytest.raises(ValueError, match="partition 99 does not exist"):
        GraphReport.from_pte(et.buffer, validation={99: {"max_abs": 0.0}})
    with pytest.raises(ValueError, match="no method 'nope'"):
        GraphReport.from_pte(et.buffer, method="nope")


@pytest.mark.executorch
def test_memory_timeline_matches_executorch_memory_profiler(tmp_path):
    """On a program ExecuTorch wrote, our live tensors per instruction (read from the .pte alone) against
    ExecuTorch's ``generate_memory_trace`` on its own program manager."""
    pytest.importorskip("executorch")
    from executorch.exir import to_edge_transform_and_lower as et_lower
    from executorch.util.activation_memory_profiler import generate_memory_trace

    model, inputs = transformer_encoder_layer()
    et = et_lower(torch.export.export(model.eval(), inputs)).to_executorch()
    generate_memory_trace(et, str(tmp_path / "et.json"), enable_memory_offsets=True)
    theirs = json.loads((tmp_path / "et.json").read_text())["traceEvents"]
    report = GraphReport.from_pte(et.buffer)
    report.write_memory_trace(tmp_path / "ours.json", enable_memory_offsets=True)
    ours = json.loads((tmp_path / "ours.json").read_text())["traceEvents"]
    assert {(e["pid"], e["ts"], e["dur"]) for e in ours} == {(e["pid"], e["ts"], e["dur"]) for e in theirs}
    assert all(e["ph"] == "X" and e["cat"] == "memory_allocation" and e["args"]["bytes"] == e["dur"] for e in ours)

    def live_sets(events):
        steps = {}
        for e in events:
            steps.setdefault(e["tid"], set()).add((e["pid"], e["ts"], e["dur"]))
        return list(steps.values())

    # ExecuTorch's steps are graph nodes (alloc nodes included), ours instructions: each of our live sets is
    # one of its steps' sets or inside one, and the peak is at most its peak
    their_sets = live_sets(theirs)
    assert all(any(s <= t for t in their_sets) for s in live_sets(ours))
    assert 0 < report.graph.peak_live_bytes <= max(sum(d for _, _, d in t) for t in their_sets)
    assert report.graph.peak_live_bytes <= sum(report.graph.arena_bytes)
    stacked = report.memory_trace()["traceEvents"]
    assert stacked[0]["ts"] == 0 and len(stacked) == len(ours)


def test_model_explorer_classes_accept_the_export(report, tmp_path):
    pytest.importorskip("model_explorer", reason="ai-edge-model-explorer is installed by scripts/install.d/devtools.sh")
    dacite = pytest.importorskip("dacite")
    from model_explorer import graph_builder as gb
    from model_explorer.utils import convert_adapter_response

    report.write_model_explorer(tmp_path / "graph.json")
    data = json.loads((tmp_path / "graph.json").read_text())
    collection = dacite.from_dict(gb.GraphCollection, data, config=dacite.Config(strict=True))
    assert convert_adapter_response({"graphCollections": [collection]}) == {"graphCollections": [data]}, \
        "Model Explorer's classes hold every field"
    main, *inner = collection.graphs
    for graph in collection.graphs:
        ids = {n.id for n in graph.nodes}
        assert all(e.sourceNodeId in ids for n in graph.nodes for e in n.incomingEdges), graph.id
    assert len(main.nodes) == len(report.graph.nodes)
    delegates = [n for n in main.nodes if n.subgraphIds]
    assert len(delegates) == len(inner) == len(report.graph.partitions)
    by_id = {g.id: g for g in inner}
    for node in delegates:  # each delegate call opens the graph of the operators its partition took
        part = report.graph.partitions[int(node.label.rsplit("#", 1)[1])]
        ops = [n.label for n in by_id[node.subgraphIds[0]].nodes if n.label != "input"]
        assert sorted(ops) == sorted(op for op, k in part.ops.items() for _ in range(k))


def test_executorch_pte_adapter_sees_the_same_graph(lowered, tmp_path):
    """ExecuTorch's Model Explorer adapter for .pte files (pte-adapter-model-explorer; not installed by default, it
    needs flatbuffers>=25.12) reads our program: the same calls in the same order, the same tensor edges."""
    adapter = pytest.importorskip("pte_adapter_model_explorer.main",
                                  reason="pip install executorch-extension-model-explorer to compare with it")
    _, et, _, _ = lowered
    (tmp_path / "bert.pte").write_bytes(et.buffer)
    theirs = adapter.PTEAdapter().convert(str(tmp_path / "bert.pte"), {})["graphCollections"][0].graphs[0]
    ours = GraphReport.from_pte(tmp_path / "bert.pte").graph
    calls = [n for n in theirs.nodes if n.namespace == "forward"]
    assert [n.label for n in calls] == [n.label.split(".")[0] if n.kind == "kernel" else n.label
                                        for n in ours.nodes if n.step >= 0]
    rename = {n.id: calls[n.step].id for n in ours.nodes if n.step >= 0}
    rename.update({n.id: "GraphInputs" for n in ours.nodes if n.kind == "input"}, out="GraphOutputs")
    their_edges = {(e.sourceNodeId, n.id, int(e.sourceNodeOutputId)) for n in theirs.nodes for e in n.incomingEdges}
    assert {(rename[s], rename[d], v) for s, d, v in ours.edges} == their_edges


def test_view_command_from_a_pte_file(lowered, tmp_path, capsys):
    _, et, _, _ = lowered
    pte = tmp_path / "bert.pte"
    pte.write_bytes(et.buffer)
    parser = argparse.ArgumentParser()
    configure_view_command(parser)
    (tmp_path / "val.json").write_text(json.dumps({"1": {"sqnr_db": 88.0}}))
    args = parser.parse_args([str(pte), "-o", str(tmp_path / "r.html"), "--memory-trace", str(tmp_path / "m.json"),
                              "--model-explorer", str(tmp_path / "me.json"), "--validation", str(tmp_path / "val.json")])
    assert run_view_command(args) == 0
    page = (tmp_path / "r.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    data = json.loads(page.split('id="graph-data">', 1)[1].split("</script>", 1)[0])
    assert data["partitions"][1]["validation"] == {"sqnr_db": 88.0}
    assert json.loads((tmp_path / "m.json").read_text())["traceEvents"]
    assert json.loads((tmp_path / "me.json").read_text())["graphs"][0]["nodes"]
    assert "r.html" in capsys.readouterr().out
    missing = parser.parse_args([str(tmp_path / "none.pte"), "-o", str(tmp_path / "x.html")])
    assert run_view_command(missing) == 2
    assert "none.pte" in capsys.readouterr().err
    (tmp_path / "bad.pte").write_bytes(b"not a program at all, just some bytes")
    assert run_view_command(parser.parse_args([str(tmp_path / "bad.pte"), "-o", str(tmp_path / "x.html")])) == 2
    assert "edgeport view:" in capsys.readouterr().err and not (tmp_path / "x.html").exists()


def test_from_pte_does_not_import_torch(lowered, tmp_path):
    _, et, _, _ = lowered
    (tmp_path / "m.pte").write_bytes(et.buffer)
    code = ("import sys; from edgeport.devtools.graph_view import GraphReport; r = GraphReport.from_pte(sys.argv[1]); "
            "r.html(); r.memory_trace(); r.model_explorer_graphs(); assert 'torch' not in sys.modules, 'torch'")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.pte")], capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-2000:]


def _chromium(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def _console_messages(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/install.d/devtools.sh installs it)")
def test_console_errors_are_caught(tmp_path):
    """The harness itself: a page that throws is reported."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>console.error('broken'); missingFunction();</script></body></html>")
    messages = _console_messages(_chromium("--dump-dom", page.as_uri()).stderr)
    assert any("missingFunction" in m for m in messages)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/install.d/devtools.sh installs it)")
def test_report_renders_in_headless_chromium(report, tmp_path):
    image = pytest.importorskip("PIL.Image", reason="Pillow reads the screenshot (scripts/install.d/devtools.sh)")
    page = tmp_path / "report.html"
    report.write_html(page)
    dom = _chromium("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert not _console_messages(dom.stderr), _console_messages(dom.stderr)
    html = dom.stdout
    assert 'data-rendered="true"' in html, "the page's script ran to its end"
    assert html.count('class="node') == len(report.graph.nodes)
    assert html.count("ExampleBackend #") == len(report.graph.partitions)
    named = [n.name for n in report.graph.nodes if n.name]
    assert named and all(f'data-name="{name}"' in html for name in named)
    assert all(name in html for name in report.graph.rejected)
    shot = tmp_path / "report.png"
    run = _chromium(f"--screenshot={shot}", "--window-size=1400,1000", page.as_uri())
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    pixels = np.asarray(image.open(shot).convert("RGB")).reshape(-1, 3)
    colours = np.unique(pixels, axis=0)
    assert len(colours) > 200, "a rendered page, not a blank one"
    blue = np.array([0x4E, 0x79, 0xA7])  # ExampleBackend's colour: partitions are drawn
    assert (np.abs(pixels.astype(int) - blue).sum(axis=1) == 0).sum() > 1000


class _DevToolsPage:
    """A headless chromium page driven through the DevTools protocol (a minimal stdlib websocket client): for
    pages that load asynchronously, where a one-shot ``--screenshot`` fires too early."""

    def __init__(self, url: str, *flags: str) -> None:
        self.proc = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--hide-scrollbars",
                                      "--remote-debugging-port=0", "--window-size=1400,900", *flags, "about:blank"],
                                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        port = None
        while port is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("chromium exited before opening its DevTools port")
            m = re.search(r"DevTools listening on ws://127.0.0.1:(\d+)(/.*)", line)
            port = int(m.group(1)) if m else None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as r:
            target = next(t for t in json.load(r) if t["type"] == "page")["webSocketDebuggerUrl"]
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        key = base64.b64encode(os.urandom(16)).decode()
        path = target.split(str(port), 1)[1]
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                           ).encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += self.sock.recv(4096)
        self.rest, self.next_id, self.events = buf.split(b"\r\n\r\n", 1)[1], 0, []
        self.call("Runtime.enable")
        self.call("Page.navigate", url=url)

    def _read(self, n: int) -> bytes:
        while len(self.rest) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the DevTools socket closed")
            self.rest += chunk
        out, self.rest = self.rest[:n], self.rest[n:]
        return out

    def call(self, method: str, **params):
        self.next_id += 1
        data = json.dumps({"id": self.next_id, "method": method, "params": params}).encode()
        size = (bytes([0x80 | len(data)]) if len(data) < 126 else bytes([0x80 | 126]) + struct.pack(">H", len(data)))
        mask = os.urandom(4)
        self.sock.sendall(bytes([0x81]) + size + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(data)))
        while True:
            _, n = self._read(2)
            n &= 0x7F
            n = struct.unpack(">H", self._read(2))[0] if n == 126 else struct.unpack(">Q", self._read(8))[0] \
                if n == 127 else n
            msg = json.loads(self._read(n))
            if msg.get("id") == self.next_id:
                return msg["result"]
            self.events.append(msg)

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def errors(self) -> list[str]:
        return [json.dumps(m["params"])[:300] for m in self.events
                if m.get("method") == "Runtime.exceptionThrown" or (m.get("method") == "Runtime.consoleAPICalled"
                                                                    and m["params"]["type"] == "error")]

    def close(self) -> None:
        self.sock.close()
        self.proc.kill()
        self.proc.wait()


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/install.d/devtools.sh installs it)")
def test_model_explorer_web_app_shows_the_export(report, tmp_path):
    """Model Explorer itself (its server and web app, in headless chromium) opens the exported JSON."""
    model_explorer = pytest.importorskip("model_explorer", reason="scripts/install.d/devtools.sh installs it")
    image = pytest.importorskip("PIL.Image")
    path = tmp_path / "graph.json"
    report.write_model_explorer(path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-c", "import sys, model_explorer as me; me.visualize_from_config(me.config()"
         ".add_model_from_path(sys.argv[1]), port=int(sys.argv[2]), no_open_in_browser=True)", str(path), str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    page = None
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://localhost:{port}/", timeout=2).close()
                break
            except OSError:
                time.sleep(0.5)
        data = model_explorer.config().add_model_from_path(str(path)).to_url_param_value()
        page = _DevToolsPage(f"http://localhost:{port}/?data={data}", "--use-angle=swiftshader",
                             "--enable-unsafe-swiftshader")
        want = f"{len(report.graph.nodes)} nodes"
        for _ in range(240):
            text = page.evaluate("document.body ? document.body.innerText : ''") or ""
            if want in text or "Error" in text:
                break
            time.sleep(0.5)
        assert want in text and report.title in text, text[:1000]
        time.sleep(3)  # let the WebGL renderer draw
        shot = tmp_path / "me.png"
        shot.write_bytes(base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"]))
        assert not page.errors(), page.errors()
        pixels = np.asarray(image.open(shot).convert("RGB")).reshape(-1, 3).astype(int)
        blue = np.array([0x4E, 0x79, 0xA7])  # the delegate calls' fill
        assert (np.abs(pixels - blue).sum(axis=1) < 30).sum() > 50, "the graph with its partitions is drawn"
    finally:
        if page is not None:
            page.close()
        server.kill()
        server.wait()
