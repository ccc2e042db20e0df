"""``BackendConformance``: the pytest conformance suite every edgeport backend runs.

A backend's test module::

    from edgeport.testing import BackendConformance

    class TestMyConformance(BackendConformance):
        backend_id = "MyBackend"
        known_gaps = {"test_runtime_matches_eager[aten.mm.default-float16-*]": "fp16 accumulates in fp16"}

        @pytest.fixture
        def compile_options(self):
            return MyCompileOptions(target="v2")

What is tested comes from the backend's capability table (read when tests are collected): every claimed op x
each claimed dtype x a few sample inputs (:mod:`~edgeport.testing.conformance.samples`), plus the models of
:attr:`BackendConformance.models`. Each of these *cases* is exported, lowered with the backend's partitioner
through ``to_edge_transform_and_lower``, serialized, written, read back and run on edgeport's runtime; six tests
check the result (``test_partitioner_only_tags``, ``test_tags_map_to_delegation_specs``,
``test_claimed_nodes_are_delegated``, ``test_only_claimed_nodes_are_delegated``, ``test_program_round_trip``,
``test_runtime_matches_eager``). A backend the stock ExecuTorch runtime also has (:attr:`stock_runtime`) runs
every case there too, in child processes (``test_stock_runtime_matches_eager``). Blob tests corrupt one lowered blob in several ways and expect an
:class:`edgeport.EdgeportError` from the executor's ``init`` (directly, and through the runtime loading a
program that carries the bad blob).

Known gaps are strict xfails: a pattern in :attr:`BackendConformance.known_gaps` (fnmatch, against
``test_name[case_id]`` or the case id alone) marks those tests ``xfail(strict=True)``, so a gap that starts
passing fails the run until it is removed from the list; a pattern that matches no test fails
``test_known_gaps_are_current``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, ClassVar

import pytest

from edgeport.backend import CapabilityTable, OpCapability
from edgeport.errors import EdgeportError
from edgeport.testing.conformance import harness as H
from edgeport.testing.conformance import stock_checks as S
from edgeport.testing.conformance.samples import SampleMaker

__all__ = ["BackendConformance"]

_CACHE = pytest.StashKey[dict]()
_CASES: dict[type, tuple[list[H.Case], list[str], list[str]]] = {}


class BackendConformance:
    """Base class of a backend's conformance tests (pytest collects subclasses named ``Test*``).

    Set :attr:`backend_id`; override the fixtures :meth:`partitioner`, :meth:`compile_options`,
    :meth:`tolerances`, :meth:`model_tolerances` when the defaults do not fit.
    """

    #: The backend under test (as registered through ``edgeport_register_backends``).
    backend_id: ClassVar[str] = ""
    #: The capability table; by default the registered backend's ``capabilities()``.
    capabilities: ClassVar[CapabilityTable | None] = None
    #: Models of :data:`edgeport.testing.models.MODELS` to lower and run.
    models: ClassVar[tuple[str, ...]] = H.DEFAULT_MODELS
    #: fnmatch pattern (``test_name[case_id]`` or ``case_id``) -> reason: strict xfails.
    known_gaps: ClassVar[Mapping[str, str]] = {}
    #: Sample makers for ops the core's table lacks (or to replace its samples), by op name.
    extra_samples: ClassVar[Mapping[str, SampleMaker]] = {}
    #: Samples per op and dtype.
    max_samples: ClassVar[int] = 3
    #: Blob corruptions to test (see :func:`edgeport.testing.conformance.harness.corrupt_blob`).
    corruptions: ClassVar[tuple[str, ...]] = H.CORRUPTIONS
    #: Where the blob header keeps the format version (DESIGN.md: after a 4-byte magic, as uint32 LE).
    blob_version_offset: ClassVar[int] = 4
    blob_version_format: ClassVar[str] = "<I"
    #: Let the partitioner delegate ops its capability table does not list (off: the table is the contract).
    allow_unclaimed_delegation: ClassVar[bool] = False
    #: The stock ExecuTorch runtime has this backend (same id and blob format): every case's program also runs
    #: there, in child processes (a crash fails the case), and must match eager PyTorch.
    stock_runtime: ClassVar[bool] = False

    # -- collection ---------------------------------------------------------------------------------------
    @classmethod
    def capability_table(cls) -> CapabilityTable:
        """The table that decides what is tested (``capabilities`` or the registered backend's)."""
        if cls.capabilities is not None:
            return cls.capabilities
        from edgeport.registry import get_backend

        spec = get_backend(cls.backend_id)
        if spec.capabilities is None:
            raise EdgeportError(f"backend {cls.backend_id!r} registers no capability table (BackendSpec.capabilities)")
        return spec.capabilities()

    @classmethod
    def conformance_cases(cls) -> tuple[list[H.Case], list[str], list[str]]:
        """``(cases, claimed ops, ops without sample inputs)``, computed once per class."""
        if cls not in _CASES:
            if not cls.backend_id:
                err = H.Case("no-backend-id", "op", error=f"{cls.__name__}.backend_id is not set")
                _CASES[cls] = ([err], [], [])
            else:
                try:
                    table = cls.capability_table()
                except Exception as exc:  # noqa: BLE001 - becomes a failing case with the message
                    err = H.Case("backend-unavailable", "op",
                                 error=f"cannot read the capability table of {cls.backend_id!r}: "
                                       f"{type(exc).__name__}: {exc}")
                    _CASES[cls] = ([err], [], [])
                else:
                    cases, untested = H.op_cases(table, cls.extra_samples, cls.max_samples)
                    cases += [H.model_case(m) for m in cls.models]
                    claimed = list(dict.fromkeys(c.op for c in table.ops))
                    _CASES[cls] = (cases, claimed, untested)
        return _CASES[cls]

    @classmethod
    def _params_of(cls, argname: str) -> list[tuple[str, Any, list[Any]]]:
        """``(id, value, marks)`` for a parametrized argument."""
        cases, claimed, untested = cls.conformance_cases()
        if argname == "case":
            return [(c.id, c, []) for c in cases]
        if argname == "corruption":
            return [(k, k, []) for k in cls.corruptions]
        if argname == "program_corruption":
            return [(k, k, []) for k in cls.corruptions if k in H.SAME_LENGTH]
        if argname == "claimed_op":
            params = []
            for op in claimed:
                marks = []
                if op in untested:
                    marks.append(pytest.mark.skip(
                        reason=f"untested: no sample inputs for {op} (add a maker to "
                               "edgeport.testing.conformance.samples.SAMPLES or to extra_samples)"))
                params.append((op, op, marks))
            return params
        raise KeyError(argname)

    _PARAMETRIZED = ("case", "corruption", "program_corruption", "claimed_op")

    def pytest_generate_tests(self, metafunc: Any) -> None:
        name = metafunc.function.__name__
        for argname in self._PARAMETRIZED:
            if argname not in metafunc.fixturenames:
                continue
            params = []
            for pid, value, marks in self._params_of(argname):
                gaps = H.matches_any(f"{name}[{pid}]", pid, self.known_gaps)
                if gaps:
                    reasons = "; ".join(self.known_gaps[g] for g in gaps)
                    marks = [*marks, pytest.mark.xfail(strict=True, reason=f"known gap: {reasons}")]
                params.append(pytest.param(value, id=pid, marks=marks))
            metafunc.parametrize(argname, params)

    @classmethod
    def generated_test_ids(cls) -> list[str]:
        """Every ``test_name[param_id]`` the class generates (what ``known_gaps`` patterns can match)."""
        ids = []
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            if not name.startswith("test_"):
                continue
            params = set(inspect.signature(fn).parameters)
            if "lowered" in params:  # the ``lowered`` fixture is parametrized through ``case``
                params.add("case")
            for argname in cls._PARAMETRIZED:
                if argname in params:
                    ids += [f"{name}[{pid}]" for pid, _, _ in cls._params_of(argname)]
        return ids

    # -- fixtures -----------------------------------------------------------------------------------------
    @pytest.fixture
    def backend_spec(self) -> Any:
        """The registered :class:`~edgeport.BackendSpec`."""
        from edgeport.registry import get_backend

        return get_backend(self.backend_id)

    @pytest.fixture
    def compile_options(self, backend_spec: Any) -> Any:
        """The compile options to lower with: the backend's options class with its defaults, or ``None``."""
        options = backend_spec.compile_options
        if options is None:
            return None
        try:
            return options()
        except TypeError:
            return None

    @pytest.fixture
    def partitioner(self, backend_spec: Any, compile_options: Any) -> Any:
        """A fresh partitioner: ``BackendSpec.partitioner(compile_options)`` (or with no argument)."""
        if backend_spec.partitioner is None:
            pytest.fail(f"backend {self.backend_id!r} registers no partitioner (BackendSpec.partitioner)")
        if compile_options is None:
            return backend_spec.partitioner()
        return backend_spec.partitioner(compile_options)

    @pytest.fixture
    def tolerances(self) -> dict[str, tuple[float, float]]:
        """``{dtype name: (atol, rtol)}`` for single-op cases (merged over the defaults)."""
        return dict(H.DEFAULT_TOLERANCES)

    @pytest.fixture
    def model_tolerances(self) -> dict[str, tuple[float, float]]:
        """``{dtype name: (atol, rtol)}`` for model cases (merged over the defaults)."""
        return dict(H.DEFAULT_MODEL_TOLERANCES)

    def _lower(self, request: Any, case: H.Case) -> H.LoweredCase:
        cache = request.config.stash.setdefault(_CACHE, {})
        key = (type(self), case.id)
        if key not in cache:
            from edgeport.registry import get_backend

            partitioner = request.getfixturevalue("partitioner")
            spec = get_backend(self.backend_id)
            cache[key] = H.lower_case(case, partitioner, self.backend_id, self.capability_table(),
                                      H.options_type_of(spec))
        return cache[key]

    @pytest.fixture
    def lowered(self, request: Any, case: H.Case) -> H.LoweredCase:
        """The case taken through the pipeline (lowered once per case and class, shared by its tests)."""
        if case.error is not None:
            pytest.fail(case.error, pytrace=False)
        lc = self._lower(request, case)
        self._skip_unclaimed(lc)
        return lc

    @pytest.fixture
    def reference(self, request: Any) -> tuple[H.LoweredCase, Any]:
        """The first case whose lowering produced a delegate of this backend, and that delegate."""
        cases, _, _ = self.conformance_cases()
        for case in cases:
            if case.error is not None:
                continue
            lc = self._lower(request, case)
            if lc.pte is None:
                continue
            for lm in lc.lowered_modules:
                if lm.backend_id == self.backend_id:
                    return lc, lm
        pytest.fail(f"no case lowered to a {self.backend_id} delegate; the blob tests need one", pytrace=False)

    # -- helpers ------------------------------------------------------------------------------------------
    @staticmethod
    def _require(lc: H.LoweredCase, *stages: str) -> None:
        order = ("build", "export", "lowering", "to_executorch")
        needed = order[: max(order.index(s) for s in stages) + 1]
        failed = lc.failed_stage(*needed)
        if failed is not None:
            pytest.fail(failed, pytrace=False)

    @staticmethod
    def _record(lc: H.LoweredCase) -> H.PartitionRecord:
        if not lc.records:
            failed = lc.failed_stage("build", "export", "lowering")
            pytest.fail(failed or f"{lc.case.id}: the partitioner was never called", pytrace=False)
        if len(lc.records) > 1:
            pytest.fail(f"{lc.case.id}: partition was called {len(lc.records)} times for one method", pytrace=False)
        return lc.records[0]

    @staticmethod
    def _skip_unclaimed(lc: H.LoweredCase) -> None:
        """Skip an op case whose sample the table does not claim (a constraint or dtype rules it out)."""
        if lc.case.kind != "op" or not lc.records:
            return
        targets = [n for n in lc.records[0].nodes if n.op == lc.case.op]
        if targets and all(n.claim is not None for n in targets):
            pytest.skip(f"not claimed by the capability table: {targets[0].claim}")

    @staticmethod
    def _init(executor: Any, blob: bytes, compile_specs: Any, pte: bytes | None) -> Any:
        """``executor.init`` as the runtime calls it (with ``named_data=`` when the executor takes it)."""
        try:
            params = inspect.signature(executor.init).parameters
        except (TypeError, ValueError):
            params = {}
        kwargs: dict[str, Any] = {}
        if pte is not None and ("named_data" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())):
            from edgeport.program import load_pte

            kwargs["named_data"] = load_pte(pte).named_data
        return executor.init(memoryview(blob), list(compile_specs), **kwargs)

    def corrupt_blob(self, kind: str, blob: bytes) -> bytes | None:
        """The corrupted blob for ``kind`` (override for a header that differs from DESIGN.md's)."""
        return H.corrupt_blob(kind, blob, self.blob_version_offset, self.blob_version_format)

    # -- backend-level tests ------------------------------------------------------------------------------
    def test_backend_is_registered(self, backend_spec: Any) -> None:
        from edgeport.backend import CapabilityTable as Table

        assert backend_spec.backend_id == self.backend_id
        assert isinstance(backend_spec.version, str) and backend_spec.version, "BackendSpec.version must be set"
        assert backend_spec.partitioner is not None, "BackendSpec.partitioner is not set"
        assert backend_spec.executor is not None, "BackendSpec.executor is not set"
        assert backend_spec.capabilities is not None, "BackendSpec.capabilities is not set"
        assert isinstance(backend_spec.capabilities(), Table), "capabilities() must return a CapabilityTable"
        ok, reason = backend_spec.is_available()
        assert isinstance(ok, bool) and isinstance(reason, str), "is_available() must return (bool, str)"
        assert ok or reason, "an unavailable backend must say why (is_available() -> (False, reason))"

    def test_capability_table_is_valid(self) -> None:
        import torch

        table = self.capability_table()
        assert isinstance(table, CapabilityTable)
        problems = []
        seen: set[str] = set()
        for cap in table.ops:
            if not isinstance(cap, OpCapability):
                problems.append(f"{cap!r} is not an OpCapability")
                continue
            if cap.op in seen:
                problems.append(f"{cap.op} is listed twice")
            seen.add(cap.op)
            try:
                H.resolve_op(cap.op)
            except ValueError as exc:
                problems.append(str(exc))
            for dt in cap.dtypes:
                if not isinstance(getattr(torch, dt, None), torch.dtype):
                    problems.append(f"{cap.op}: {dt!r} is not a torch dtype name")
        assert not problems, "capability table problems:\n" + "\n".join(problems)

    def test_compile_options_round_trip(self, compile_options: Any) -> None:
        if compile_options is None:
            pytest.skip("the backend has no compile options")
        specs = compile_options.to_compile_specs()
        again = type(compile_options).from_compile_specs(specs)
        assert again == compile_options, f"{again!r} != {compile_options!r} after to/from_compile_specs"

    def test_op_has_sample_inputs(self, claimed_op: str) -> None:
        cases, _, _ = self.conformance_cases()
        assert any(c.op == claimed_op for c in cases), f"{claimed_op}: no case was generated"

    def test_known_gaps_are_current(self) -> None:
        ids = self.generated_test_ids()
        stale = [p for p in self.known_gaps if not any(H.matches_any(i, i.split("[", 1)[-1][:-1], [p]) for i in ids)]
        assert not stale, f"known_gaps patterns that match no test (remove them): {stale}"

    # -- per-case tests -----------------------------------------------------------------------------------
    def test_partitioner_only_tags(self, lowered: H.LoweredCase) -> None:
        record = self._record(lowered)
        problems = [p for p in record.problems if "PartitionResult" in p] + record.changes
        assert not problems, (
            f"{lowered.case.id}: a partitioner may only set node.meta['delegation_tag']; it:\n  "
            + "\n  ".join(problems)
        )

    def test_tags_map_to_delegation_specs(self, lowered: H.LoweredCase) -> None:
        record = self._record(lowered)
        assert not record.problems, f"{lowered.case.id}:\n  " + "\n  ".join(record.problems)

    def test_claimed_nodes_are_delegated(self, lowered: H.LoweredCase) -> None:
        from edgeport.aot.capability_partitioner import op_name

        record = self._record(lowered)
        case = lowered.case
        missing = H.describe_untagged(record)
        assert not missing, (
            f"{case.id}: the capability table claims these nodes but the partitioner did not tag them: {missing}"
        )
        if case.kind == "op":
            assert case.op in record.ops_seen, (
                f"{case.id}: {case.op} never reached the partitioner (it saw {sorted(set(record.ops_seen))}); "
                f"if it is decomposed on the way to the edge dialect, return it from ops_to_not_decompose"
            )
        self._require(lowered, "lowering")
        delegated: list[str] = []
        for lm in lowered.lowered_modules:
            assert lm.backend_id == self.backend_id, f"a delegate went to {lm.backend_id!r}"
            delegated += [op_name(n.target) for n in lm.original_module.graph.nodes if n.op == "call_function"]
        if case.kind == "op":
            assert case.op in delegated, f"{case.id}: {case.op} is in no {self.backend_id} delegate"
            left = [n.name for n in lowered.edge.exported_program().graph.nodes
                    if n.op == "call_function" and op_name(n.target) == case.op]
            assert not left, f"{case.id}: {case.op} nodes {left} stayed outside the delegates"

    def test_only_claimed_nodes_are_delegated(self, lowered: H.LoweredCase) -> None:
        if self.allow_unclaimed_delegation:
            pytest.skip("allow_unclaimed_delegation is set")
        record = self._record(lowered)
        extra = H.describe_unclaimed_tagged(record)
        assert not extra, (
            f"{lowered.case.id}: the partitioner tagged nodes its capability table does not claim (add them to "
            f"the table, which is also the docs' op-support table): {extra}"
        )

    def test_program_round_trip(self, lowered: H.LoweredCase, tmp_path: Any) -> None:
        from edgeport.program import load_pte, verify_program

        self._require(lowered, "to_executorch")
        path = tmp_path / "program.pte"
        lowered.executorch.save(str(path))
        data = path.read_bytes()
        assert data == lowered.pte, "the written file differs from ExecutorchProgramManager.buffer"
        loaded = load_pte(data)
        verify_program(loaded.program)
        plans = {p.name: i for i, p in enumerate(loaded.program.execution_plan)}
        assert "forward" in plans, f"no 'forward' method in the program ({sorted(plans)})"
        delegates = loaded.program.execution_plan[plans["forward"]].delegates
        assert [d.id for d in delegates] == [self.backend_id] * len(delegates)
        assert len(delegates) == len(lowered.lowered_modules), (
            f"{len(lowered.lowered_modules)} lowered modules but {len(delegates)} delegates in the program"
        )
        stored = sorted(
            (bytes(loaded.delegate_data("forward", i)), sorted((c.key, bytes(c.value)) for c in d.compile_specs))
            for i, d in enumerate(delegates)
        )
        made = sorted(
            (lm.processed_bytes, sorted((c.key, bytes(c.value)) for c in lm.compile_specs))
            for lm in lowered.lowered_modules
        )
        assert stored == made, "delegate blobs or compile specs changed between lowering and reading back"
        loaded.release()

    def test_runtime_matches_eager(self, lowered: H.LoweredCase, backend_spec: Any, tmp_path: Any,
                                   tolerances: dict, model_tolerances: dict) -> None:
        import torch

        from edgeport.runtime import Runtime

        self._require(lowered, "to_executorch")
        ok, why = backend_spec.is_available()
        if not ok:
            pytest.skip(f"{self.backend_id} is not available here: {why}")
        path = tmp_path / "program.pte"
        path.write_bytes(lowered.pte)
        program = Runtime.get().load_program(str(path))
        method = program.load_method("forward")
        try:
            statuses = {(d.backend_id, d.status) for d in method.profile.delegates}
            assert statuses <= {(self.backend_id, "backend")}, f"delegates did not run on the backend: {statuses}"
            inputs = [t.detach() if t.dtype == torch.bfloat16 else t.detach().numpy() for t in lowered.inputs]
            got = method.execute(inputs)
        finally:
            method.release()
        tol = {**H.DEFAULT_TOLERANCES, **tolerances} if lowered.case.kind == "op" else \
            {**H.DEFAULT_MODEL_TOLERANCES, **model_tolerances}
        H.compare_outputs(got, lowered.expected, tol, lowered.case.id)

    def test_stock_runtime_matches_eager(self, lowered: H.LoweredCase, request: Any, tolerances: dict,
                                         model_tolerances: dict) -> None:
        if not self.stock_runtime:
            pytest.skip(f"{self.backend_id}: stock_runtime is off (the stock ExecuTorch runtime has no such backend)")
        missing = S.stock_runtime_missing()
        if missing:
            pytest.skip(missing)
        self._require(lowered, "to_executorch")
        cache = request.config.stash.setdefault(_CACHE, {})
        key = (type(self), "stock-runtime")
        if key not in cache:
            cache[key] = S.run_all_on_stock(self.conformance_cases()[0], lambda c: self._lower(request, c))
        tol = {**H.DEFAULT_TOLERANCES, **tolerances} if lowered.case.kind == "op" else \
            {**H.DEFAULT_MODEL_TOLERANCES, **model_tolerances}
        S.check_stock_result(cache[key].get(lowered.case.id), lowered, tol)

    # -- blob tests ---------------------------------------------------------------------------------------
    def test_good_blob_initializes(self, reference: tuple[H.LoweredCase, Any], backend_spec: Any) -> None:
        ok, why = backend_spec.is_available()
        if not ok:
            pytest.skip(f"{self.backend_id} is not available here: {why}")
        lc, lm = reference
        executor = backend_spec.executor()
        handle = self._init(executor, lm.processed_bytes, lm.compile_specs, lc.pte)
        executor.destroy(handle)

    def test_corrupted_blob_rejected_at_init(self, reference: tuple[H.LoweredCase, Any], backend_spec: Any,
                                             corruption: str) -> None:
        ok, why = backend_spec.is_available()
        if not ok:
            pytest.skip(f"{self.backend_id} is not available here: {why}")
        lc, lm = reference
        bad = self.corrupt_blob(corruption, lm.processed_bytes)
        if bad is None:
            pytest.skip(f"corruption {corruption!r} does not apply to a {len(lm.processed_bytes)}-byte blob")
        executor = backend_spec.executor()
        try:
            handle = self._init(executor, bad, lm.compile_specs, lc.pte)
        except EdgeportError as exc:
            assert str(exc).strip(), "the error must say what is wrong"
            return
        except Exception as exc:  # noqa: BLE001
            pytest.fail(
                f"init raised {type(exc).__name__}: {exc} for a {corruption} blob; raise an edgeport.EdgeportError "
                "subclass (edgeport.ProgramError) that says what is wrong", pytrace=False)
        executor.destroy(handle)
        pytest.fail(f"init accepted a {corruption} blob", pytrace=False)

    def test_describe_blob(self, reference: tuple[H.LoweredCase, Any], backend_spec: Any) -> None:
        from edgeport.testing.conformance.runtime_checks import check_describe_blob

        blob = bytes(reference[1].processed_bytes)
        kinds = ("truncated_header", "truncated_half", "bad_magic", "version_mismatch", "garbage")
        check_describe_blob(backend_spec, blob, [b for k in kinds if (b := self.corrupt_blob(k, blob)) is not None])

    def test_corrupted_blob_in_program_rejected_at_load(self, reference: tuple[H.LoweredCase, Any],
                                                        backend_spec: Any, program_corruption: str) -> None:
        from edgeport.runtime import Runtime

        ok, why = backend_spec.is_available()
        if not ok:
            pytest.skip(f"{self.backend_id} is not available here: {why}")
        lc, lm = reference
        bad = self.corrupt_blob(program_corruption, lm.processed_bytes)
        if bad is None:
            pytest.skip(f"corruption {program_corruption!r} does not apply")
        pte = H.patch_program(lc.pte, lm.processed_bytes, bad)
        with pytest.raises(EdgeportError) as info:
            Runtime.get().load_program(pte).load_method("forward")
        assert self.backend_id in str(info.value) or str(info.value).strip()

