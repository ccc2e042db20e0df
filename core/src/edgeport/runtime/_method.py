"""Load one verified ``ExecutionPlan`` into a :class:`MethodPlan`: everything a run needs, resolved once.

Values become Python objects (scalars, tuples, constant tensors as zero-copy read-only views of the program's
constant segment; :mod:`._values`), every operator becomes its kernel (:mod:`._instructions`), calls on
constants are folded (:mod:`._folding`), every delegate becomes an initialised executor handle
(:mod:`._delegates`), and each instruction a ``(function, argument getter, post)`` triple (:mod:`._compile`).
Planned memory is laid out in :mod:`._memory`; :class:`~edgeport.runtime._execute.MethodRunner` runs the result.
"""

from __future__ import annotations

from typing import Any

from edgeport.errors import ProgramError
from edgeport.program import schema as S
from edgeport.runtime._compile import ChainCompiler, CompiledChain
from edgeport.runtime._cse import alias_reuses, common_calls
from edgeport.runtime._delegates import Delegates
from edgeport.runtime._execute import MethodRunner
from edgeport.runtime._folding import fold_constants
from edgeport.runtime._fuse import masked_row_guards
from edgeport.runtime._instructions import analyze_instructions
from edgeport.runtime._io import Binder, borrowable_inputs, input_binders
from edgeport.runtime._kvexpand import persistent_expands
from edgeport.runtime._memory import Context, MemoryLayout
from edgeport.runtime._profile import MethodProfile
from edgeport.runtime._values import MethodValues
from edgeport.runtime._views import reshape_delegates

__all__ = ["MethodPlan"]

#: How deeply portable fallback methods may nest (a fallback whose own delegates fall back, ...).
_MAX_FALLBACK_DEPTH = 4


class MethodPlan:
    """The load-time analysis of one method: value templates, op lists, input binders, delegate handles.

    ``owner`` is the runtime ``Program`` (for delegate data and fallback methods); ``kernels`` a
    :class:`~edgeport.registry.KernelRegistry`. Raises ``ProgramError``, ``UnsupportedOperatorError`` or
    ``BackendNotFoundError`` for what cannot run, with every delegate handle made so far destroyed.
    """

    def __init__(self, owner: Any, plan_index: int, kernels: Any, *, allow_fallback: bool = False,
                 fold_constants: bool = True, backend_options: dict[str, Any] | None = None,
                 _fallback_depth: int = 0) -> None:
        self.owner = owner
        lp = owner._loaded
        self.plan: S.ExecutionPlan = lp.program.execution_plan[plan_index]
        self.name = self.plan.name
        self.where = f"method {self.name!r}"
        self.kernels = kernels
        self._fallback_depth = _fallback_depth
        self.profile = MethodProfile(self.name)
        self.backend_options = dict(backend_options or {})
        self._delegates = Delegates(self.where, self.profile, allow_fallback, self._load_fallback,
                                    self.backend_options)
        try:
            self._load(lp, plan_index, fold_constants)
        except BaseException:
            self.destroy()
            raise

    def _load(self, lp: Any, plan_index: int, fold: bool) -> None:
        plan = self.plan
        self.input_indices, self.output_indices = list(plan.inputs), list(plan.outputs)
        mv = MethodValues(plan, lp, self.where)
        analysis = analyze_instructions(mv, plan, self.kernels)
        self.stateful = bool(analysis.state_tensors)
        #: the objects every context starts from (tensors other than constants are filled per context)
        self.static_template = mv.static_template()
        self._delegates.init_all(lp, plan_index)
        if fold:  # after init: calls of pure delegates on constants fold too
            self.profile.folded_instructions = fold_constants(mv, plan, analysis, self.static_template,
                                                              self._delegates.items)
            analysis.viewed_delegates = reshape_delegates(mv, plan, analysis, self._delegates.items)
            self.profile.viewed_delegates = len(analysis.viewed_delegates)
            analysis.fused, analysis.fused_away = masked_row_guards(mv, plan, analysis, self.static_template)
            self.profile.fused_calls = len(analysis.fused_away)
            analysis.reused = common_calls(mv, plan, analysis, self.static_template, self._delegates.items)
            self.profile.reused_calls = len(analysis.reused)
            analysis.aliased = alias_reuses(mv, plan, analysis, self._delegates.items)
            for ci, ii in analysis.aliased:  # their out slots now change during a run
                call = analysis.chains[ci][ii]
                analysis.rw.add(call.params[call.outs[0]])  # type: ignore[union-attr]
            analysis.persistent = persistent_expands(mv, plan, analysis, self._delegates.items)
            self.profile.persistent_expands = len(analysis.persistent)
        self._layout = MemoryLayout(mv, self.static_template, analysis.viewed_delegates.values(),
                                    [(at, pe.out) for at, pe in analysis.persistent.items()])
        compiler = ChainCompiler(mv, plan, analysis, self._layout, self._delegates.items)
        self.chains: list[CompiledChain] = compiler.compile()
        #: whether any portable kernel runs (only then does a run silence numpy's floating-point warnings: entering
        #: ``np.errstate`` costs ~30 us right after a delegate has evicted the caches, ~1% of a MobileNetV2 run)
        self.uses_kernels = compiler.kernel_ops > 0
        self.profile.num_instructions = sum(len(chain.instructions) for chain in plan.chains)
        for name, entry, _ in analysis.resolved_ops:
            if entry is not None:
                self.profile.kernel_libraries[name] = entry.library
        for e in getattr(self.kernels, "overridden", []):
            if e.op in self.profile.kernel_libraries:
                self.profile.overridden_kernels[e.op] = e.library
        #: inputs bound as the caller's arrays (only delegates read them); their slots are cleared after a run
        self.borrowed: tuple[int, ...] = tuple(sorted(borrowable_inputs(
            mv, plan, analysis, compiler.delegate_inputs, compiler.delegate_outputs)))
        self.binders: list[Binder] = input_binders(mv, self.input_indices, self._layout, set(self.borrowed))

    def _load_fallback(self, di: int, method: str) -> MethodRunner:
        names = [p.name for p in self.owner._loaded.program.execution_plan]
        if method not in names or method == self.name:
            raise ProgramError(f"{self.where} delegates[{di}]: portable fallback method {method!r} is not in the "
                               f"program (methods: {names})")
        if self._fallback_depth > _MAX_FALLBACK_DEPTH:
            raise ProgramError(f"{self.where}: portable fallbacks nest too deeply")
        sub = MethodPlan(self.owner, names.index(method), self.kernels, allow_fallback=True,
                         backend_options=self.backend_options, _fallback_depth=self._fallback_depth + 1)
        return MethodRunner(sub)

    def new_context(self) -> Context:
        """Fresh planned memory and value slots for one run (``RuntimeExecutionError`` when it cannot be had)."""
        return self._layout.new_context()

    def destroy(self) -> None:
        """Destroy delegate handles and fallback methods (idempotent)."""
        self._delegates.destroy()
