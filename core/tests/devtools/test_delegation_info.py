"""get_delegation_info: ExecuTorch's own function is the oracle on ExecuTorch's lowered graphs; on edgeport's, the
written program (its delegate calls) and the partitioner's rejections are."""

from __future__ import annotations

import operator

import pytest
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.devtools import format_delegated_graph, get_delegation_info
from edgeport.program import load_pte
from edgeport.program import schema as S
from edgeport.testing.models import cnn_bn_pool, transformer_encoder_layer

xnnpack = pytest.importorskip("edgeport_xnnpack")
MODELS = {"transformer_encoder_layer": transformer_encoder_layer, "cnn_bn_pool": cnn_bn_pool}


@pytest.mark.executorch
@pytest.mark.parametrize("name", sorted(MODELS))
def test_counts_match_executorch_on_its_lowered_graph(name):
    pytest.importorskip("executorch")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as EtXnnpack
    from executorch.devtools.backend_debug import get_delegation_info as et_get_delegation_info
    from executorch.exir import to_edge_transform_and_lower as et_lower

    model, example = MODELS[name]()
    gm = et_lower(torch.export.export(model.eval(), example), partitioner=[EtXnnpack()]).exported_program().graph_module
    ours, theirs = get_delegation_info(gm), et_get_delegation_info(gm)
    assert ours.get_summary() == theirs.get_summary()
    assert ours.num_delegated_subgraphs > 0
    # ExecuTorch names op types after node names (aten_add_tensor); ours after operators (aten.add.Tensor)
    mine = {k.replace(".", "_").lower(): (v.delegated, v.non_delegated) for k, v in ours.delegation_by_operator.items()}
    other = {k.lower(): (v.delegated, v.non_delegated) for k, v in theirs.delegation_by_operator.items()}
    assert mine == other


@pytest.mark.parametrize("name", sorted(MODELS))
def test_edgeport_graph_partitions_match_the_written_program(name):
    model, example = MODELS[name]()
    partitioner = xnnpack.XnnpackPartitioner()
    manager = to_edge_transform_and_lower(torch.export.export(model.eval(), example), partitioner=[partitioner])
    gm = manager.exported_program().graph_module
    info = get_delegation_info(gm, [partitioner])
    plan = load_pte(manager.to_executorch().buffer).program.execution_plan[0]
    calls = sum(isinstance(i.instr_args, S.DelegateCall) for c in plan.chains for i in c.instructions)
    assert info.num_delegated_subgraphs == calls == len(info.partitions)
    assert all(p.backend_id == "XnnpackBackend" and p.node_count == sum(p.ops.values()) > 0 for p in info.partitions)
    outside = [n.name for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem
               and "call_delegate" not in str(n.target)]
    assert sorted(info.rejected) == sorted(outside), "every node left outside has the partitioner's reason"
    table = info.get_operator_delegation_table()
    assert table[-1] == {"op_type": "Total", "occurrences_in_delegated_graphs": info.num_delegated_nodes,
                         "occurrences_in_non_delegated_graphs": info.num_non_delegated_nodes}
    text = format_delegated_graph(gm)
    assert text.count("= delegate XnnpackBackend:") == calls


def test_partition_boundaries_name_the_tensors_crossing_them():
    model, example = transformer_encoder_layer()
    manager = to_edge_transform_and_lower(torch.export.export(model.eval(), example),
                                          partitioner=[xnnpack.XnnpackPartitioner()])
    first = get_delegation_info(manager.exported_program().graph_module).partitions[0]
    assert first.inputs == [f"src: float32{list(example[0].shape)}"]
    assert first.outputs and all(": float32[" in o for o in first.outputs)
