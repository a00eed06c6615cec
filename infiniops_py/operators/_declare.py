"""One declaration per operator: `Operator`, from which its custom operator, fake kernel and lowering come.

An operator module declares its operator once, before its public function::

    SPEC = Operator(name="rms_norm", fields={"hidden_size": 4096}, buckets=("tokens",), reference=reference,
                    overloads=(Overload(when={"out": None}, fake=_fake),
                               Overload("out", when={"out": GIVEN}, outputs=0, returns=("out",))),
                    mutates=("out",))

    @SPEC.define
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        ...  # the contract's checks, then dispatch(SPEC, SPEC.key(...), ...)

The public function's own signature is the only place its arguments are written: `Operator.define` reads it
(names, order, defaults and annotations) and derives, per `Overload`, the ``torch.ops.infiniops`` schema (the
annotation gives the type: ``torch.Tensor | None`` is ``Tensor?``, ``tuple[int, int]`` is ``int[]``; `mutates`
gives ``Tensor(a!)``; `Param` overrides an argument whose schema form differs), the run-time kernel (the
public function called by keyword with the overload's selector values) and the fake kernel. It returns the
public function itself wrapped by a generated function of the same signature that, while
``torch.compile``/``torch.export`` trace or for FakeTensor inputs, calls the custom operator of the overload
whose `Overload.when` matches the call (`lowered`), and otherwise runs the body. The dispatch key is
`OpSpec.key` (made from `fields` and `buckets`, by name).

Converting an operator written in the earlier style (a schema in ``_torch_library.SCHEMAS``, a fake in
``_FAKES``, an adapter in ``_torch_kernels.kernels()``, an ``if lowered(x):`` branch, an `OpSpec` at the end of
its module and a key tuple written by position): drop the three table entries and the branch; move the
reference above the public function and replace the `OpSpec` by an `Operator` of the same fields, buckets,
reference and doc, placed before the function, with one `Overload` per branch of the old lowering (its
selector as `when`, its fake as `fake`, ``outputs`` and ``returns`` as the schema's result) and the mutated
arguments in `mutates`; decorate the function with ``@SPEC.define``; and build the key with
``SPEC.key(device_type, dtype, <field>=..., <bucket>=<raw size>)`` (the size class is taken there).
``tests/test_torch_ops.py`` then compiles, exports and fakes it with the others once it is in their lists.

`sizes`, `tune_sizes` and `sample_inputs` describe a call by its fields and sizes (for conformance, tuning and
benchmarks): the testing layer draws each size from `sizes` and builds the call with `sample_inputs` (where the
family has no strategy module), and the tuner (``tuning/inputs.py``) builds every call with it, at `tune_sizes`
(or the largest of `sizes`) unless told other sizes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, final

import torch
import torch.compiler as _compiler
from torch._subclasses.fake_tensor import FakeTensor

from infiniops_py.operators import _torch_library
from infiniops_py.problem import OpSpec

__all__ = ["GIVEN", "Operator", "Overload", "Param", "SampleInputs", "Sampler", "sample_tensor"]


@final
class _Given:
    """`GIVEN`: an argument that is not None."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "GIVEN"


GIVEN: Final = _Given()

SampleInputs = Callable[[Mapping[str, int], torch.dtype, torch.device, torch.Generator],
                        tuple[tuple[Any, ...], dict[str, Any]]]
"""``sample_inputs(values, dtype, device, generator) -> (args, kwargs)``: a call of the public function whose
problem has the given fields and sizes (`values`: every problem field and every size of `Operator.sizes`, by
name), random values from `generator`. The conformance suite draws the sizes from `Operator.sizes` (and the bool
fields); the tuner passes a problem's fields and its bucket's sizes."""


def sample_tensor(generator: torch.Generator, *shape: int, dtype: torch.dtype, device: torch.device,
                  scale: float = 1.0) -> torch.Tensor:
    """Standard-normal values times `scale`, drawn in float32 on the CPU from `generator`, then cast and moved:
    the same values on every device and dtype."""
    return (torch.randn(shape, generator=generator) * scale).to(device=device, dtype=dtype)


@dataclass(frozen=True)
class Sampler:
    """The draws of a `SampleInputs`, all from `generator` on the CPU, then moved: the same values on every device.

    Calling it gives `sample_tensor` values in `dtype` on `device`; `scale` and `index` give the other inputs.
    """

    generator: torch.Generator
    dtype: torch.dtype
    device: torch.device

    def __call__(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        return sample_tensor(self.generator, *shape, dtype=self.dtype, device=self.device, scale=scale)

    def scale(self, *shape: int) -> torch.Tensor:
        """Positive float32 values in [0.5, 1.5): fp8 scales and descales, ALiBi slopes."""
        return (0.5 + torch.rand(shape, generator=self.generator)).to(self.device)

    def index(self, n: int, high: int) -> torch.Tensor:
        """`n` distinct int64 indices in ``[0, high)`` (a permutation's head): state and conv-state slots."""
        return torch.randperm(high, generator=self.generator)[:n].to(self.device)


_KINDS: Final[dict[str, str]] = {  # the public function's annotation -> the schema type
    "torch.Tensor": "Tensor", "torch.Tensor|None": "Tensor?", "float": "float", "float|None": "float?",
    "int": "int", "int|None": "int?", "bool": "bool", "str": "str", "str|None": "str?",
    "tuple[int,int]": "int[]", "tuple[float,float]": "float[]",
}


@dataclass(frozen=True)
class Param:
    """The schema form of a public argument that its annotation does not give.

    Attributes:
        kind: the schema type (``"SymInt"``, ``"Tensor?"``, ``"str"``).
        name: the schema argument's name, when not the public one (``group_name`` for ``group``).
        to_schema: the value the operator gets, from the public value and the call's other arguments by name
            (an int `cache_seqlens` made a tensor); None: as given.
        to_public: the public value, from the operator's (a group from its name); None: as given (``int[]``
            and ``float[]`` become tuples, ``SymInt`` an int).
    """

    kind: str
    name: str | None = None
    to_schema: Callable[[Any, Mapping[str, Any]], Any] | None = None
    to_public: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Overload:
    """One form of the call, one ``torch.ops.infiniops`` overload.

    Attributes:
        name: the overload's name; empty for the default one.
        when: public argument -> the value that selects this form: None (the argument is None), True or
            False (it is that bool), `GIVEN` (it is not None). An argument selected by None, True or False is
            not in the schema (the kernel passes that value); one selected by `GIVEN` is. The first overload
            whose `when` all hold is the call's; when none does, the body runs (its checks raise).
        outputs: how many new tensors the operator returns (0, 1 or 2).
        returns: the arguments the public function returns after the outputs (those it updates in place).
        fake: the output shapes: called with the schema's arguments by name (meta or fake tensors), returns
            the `outputs` new tensors (one tensor, or a tuple); None when `outputs` is 0.
        drop: public arguments that are not in this form's schema beside those of `when`: the kernel leaves
            them at their defaults.
        finish: the public result from the operator's outputs (a tuple) and the call's arguments by name, when
            it is not the outputs followed by `returns`.
    """

    name: str = ""
    when: Mapping[str, Any] = field(default_factory=dict)
    outputs: int = 1
    returns: tuple[str, ...] = ()
    fake: Callable[..., Any] | None = None
    drop: tuple[str, ...] = ()
    finish: Callable[[tuple[Any, ...], Mapping[str, Any]], Any] | None = None


@dataclass(frozen=True, kw_only=True, eq=False)
class Operator(OpSpec):
    """An operator's one declaration: its `OpSpec` and how its public function lowers to a custom operator.

    Attributes (beside `OpSpec`'s):
        overloads: the forms of the call (`Overload`), tried in order; the default: one form, one output.
        mutates: the public arguments written in place (``Tensor(a!)`` in every schema that has them).
        params: `Param` per public argument whose schema form its annotation does not give.
        sizes: size name -> the values the testing layer draws (``{"tokens": (1, 3, 17)}``); the tuner's default
            is the largest, unless `tune_sizes` gives it.
        sample_inputs: a call of the given sizes (`SampleInputs`); None: none declared.
        tune_sizes: size name -> the tuner's and the benchmarks' default (a representative call: Gemm's
            ``m=1, n=4096, k=4096``), each a size `sample_inputs` reads; empty: the largest of each of `sizes`.
        tolerance_as: the operator whose tolerances (``infiniops_py/testing/tolerances.py``) apply, when not
            its own name.
        lowered_by: the argument whose FakeTensor-ness decides the lowering outside tracing (the first one
            when None).
    """

    overloads: tuple[Overload, ...] = (Overload(),)
    mutates: tuple[str, ...] = ()
    params: Mapping[str, Param] = field(default_factory=dict)
    sizes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    sample_inputs: SampleInputs | None = None
    tune_sizes: Mapping[str, int] = field(default_factory=dict)
    tolerance_as: str | None = None
    lowered_by: str | None = None

    def define(self, body: Callable[..., Any]) -> Callable[..., Any]:
        """Make `body` the public function: define each overload's custom operator from its signature, and
        return the function that lowers to them under tracing and otherwise runs `body` (same signature,
        name, module, annotations and docstring).

        Raises:
            ValueError: the function is defined already, or the declaration does not fit `body`'s signature
                (an unknown argument name, an annotation with no schema type and no `Param`, a form with
                outputs but no fake).
        """
        if self.function is not None:
            raise ValueError(f"{self.name}: the public function is defined already ({self.function!r})")
        signature = inspect.signature(body)
        names = tuple(signature.parameters)
        known = {*(n for o in self.overloads for n in (*o.when, *o.drop)), *self.mutates, *self.params,
                 *([self.lowered_by] if self.lowered_by else [])}
        if not known <= set(names):
            raise ValueError(f"{self.name}: {sorted(known - set(names))} are not arguments of {body.__qualname__}")
        for overload in self.overloads:  # every form checked before anything is defined
            if overload.outputs and overload.fake is None:
                raise ValueError(f"{self.name}.{overload.name or 'default'}: a form with outputs needs a fake kernel")
            _schema(self, overload, signature)
        forms: list[_Form] = []
        public = _generated(body, signature, lambda values: _lower(body, names, forms, values),
                            self.lowered_by or names[0])
        object.__setattr__(self, "function", public)
        for overload in self.overloads:
            forms.append(_define(self, overload, signature, public))
        return public


@dataclass(frozen=True)
class _Form:
    """What lowering a call of one overload needs, computed once when the function is defined."""

    when: tuple[tuple[str, Any], ...]
    op: Any  # the torch.ops packet (default form) or OpOverload
    carried: tuple[str, ...]
    to_schema: tuple[Callable[[Any, Mapping[str, Any]], Any] | None, ...]
    outputs: int
    returns: tuple[str, ...]
    finish: Callable[[tuple[Any, ...], Mapping[str, Any]], Any] | None


def _lower(body: Callable[..., Any], names: tuple[str, ...], forms: list[_Form], values: tuple[Any, ...]) -> Any:
    """The call of the public function with `values` (its arguments in signature order) through the custom
    operator of the form they select, or through `body` (whose checks refuse them) when none fits."""
    call = dict(zip(names, values))
    for form in forms:
        if all(_holds(call[n], v) for n, v in form.when):
            break
    else:
        return body(**call)
    args = [call[n] if c is None else c(call[n], call) for n, c in zip(form.carried, form.to_schema)]
    result = form.op(*args)
    if form.finish is not None:
        return form.finish(tuple(result) if form.outputs > 1 else (result,), call)
    kept = tuple(call[n] for n in form.returns)
    if form.outputs == 0:
        return None if not kept else kept[0] if len(kept) == 1 else kept
    both = (*(tuple(result) if form.outputs > 1 else (result,)), *kept)
    return both[0] if len(both) == 1 else both


def _holds(value: Any, wanted: Any) -> bool:
    return value is not None if wanted is GIVEN else value is wanted


def _schema_names(spec: Operator, overload: Overload, names: tuple[str, ...]) -> list[str]:
    """The public arguments in `overload`'s schema, in signature order."""
    left_out = {n for n, v in overload.when.items() if v is not GIVEN} | set(overload.drop)
    return [n for n in names if n not in left_out]


def _kind(spec: Operator, parameter: inspect.Parameter) -> str:
    param = spec.params.get(parameter.name)
    if param is not None:
        return param.kind
    annotation = parameter.annotation
    if isinstance(annotation, str):  # under ``from __future__ import annotations``
        text = annotation
    elif isinstance(annotation, type):
        module = annotation.__module__
        text = annotation.__qualname__ if module == "builtins" else f"{module}.{annotation.__qualname__}"
    else:
        text = repr(annotation)  # ``torch.Tensor | None``, ``tuple[int, int]``
    kind = _KINDS.get(text.replace(" ", ""))
    if kind is None:
        raise ValueError(f"{spec.name}: argument {parameter.name!r} annotated {text!r} has no schema type: declare "
                         f"it in params (Param(kind=...))")
    return kind


def _schema(spec: Operator, overload: Overload, signature: inspect.Signature) -> str:
    """``"(Tensor x, Tensor(a!) out) -> ()"``: the argument list and return type of one overload."""
    names = tuple(signature.parameters)
    parts = []
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    for n in _schema_names(spec, overload, names):
        kind = _kind(spec, signature.parameters[n])
        if overload.when.get(n) is GIVEN:
            kind = kind.removesuffix("?")
        if n in spec.mutates:
            kind = kind.replace("Tensor", f"Tensor({next(letters)}!)", 1)
        param = spec.params.get(n)
        parts.append(f"{kind} {param.name if param is not None and param.name else n}")
    returns = {0: "()", 1: "Tensor"}.get(overload.outputs, "(" + ", ".join(["Tensor"] * overload.outputs) + ")")
    return f"({', '.join(parts)}) -> {returns}"


def _define(spec: Operator, overload: Overload, signature: inspect.Signature, public: Callable[..., Any]) -> _Form:
    """Define `overload`'s custom operator: schema, run-time kernel (the public function) and fake kernel;
    return what lowering a call of this form needs."""
    names = tuple(signature.parameters)
    carried = _schema_names(spec, overload, names)
    fixed = {n: v for n, v in overload.when.items() if v is not GIVEN}
    converters: list[Callable[[Any], Any] | None] = []
    to_schema: list[Callable[[Any, Mapping[str, Any]], Any] | None] = []
    for n in carried:
        param = spec.params.get(n)
        kind = _kind(spec, signature.parameters[n])
        listed = kind in ("int[]", "float[]")
        if param is not None and param.to_public is not None:
            converters.append(param.to_public)
        else:
            converters.append(tuple if listed else int if kind == "SymInt" else None)
        if param is not None and param.to_schema is not None:
            to_schema.append(param.to_schema)
        else:
            to_schema.append(_as_list if listed else None)
    outputs, kept = overload.outputs, len(overload.returns)

    def kernel(*args: Any) -> Any:
        call = {n: (v if c is None else c(v)) for n, c, v in zip(carried, converters, args)}
        result = public(**call, **fixed)
        if outputs == 0:
            return None
        if kept == 0:
            return tuple(result) if outputs > 1 else result
        return tuple(result[:outputs]) if outputs > 1 else result[0]

    fake = overload.fake

    def fake_kernel(*args: Any) -> Any:
        if fake is None:
            return None
        return fake(**dict(zip(carried, args)))

    qualified = f"{spec.name}.{overload.name}" if overload.name else spec.name
    _torch_library.define(qualified, _schema(spec, overload, signature), kernel, fake_kernel)
    packet = getattr(getattr(torch.ops, _torch_library.NAMESPACE), spec.name)
    op = getattr(packet, overload.name) if overload.name else packet  # a graph's node targets the packet
    return _Form(tuple(overload.when.items()), op, tuple(carried),
                 tuple(to_schema), overload.outputs, overload.returns, overload.finish)


def _as_list(value: Any, call: Mapping[str, Any]) -> Any:
    """A tuple argument (``window_size``) as the list an ``int[]``/``float[]`` schema argument takes."""
    return list(value) if isinstance(value, tuple) else value


def _generated(body: Callable[..., Any], signature: inspect.Signature, lower: Callable[[tuple[Any, ...]], Any],
               first: str) -> Callable[..., Any]:
    """A function of `body`'s signature that lowers (`_torch_library.lowered`'s test, written inline so that
    an eager call costs one call more than `body` alone, no more) or else calls `body`."""
    names = list(signature.parameters)
    namespace: dict[str, Any] = {
        "_body": body, "_lower": lower, "_dynamo": torch.compiler.is_dynamo_compiling, "_compiler": _compiler,
        "_on_meta": _torch_library._ON_META, "_Tensor": torch.Tensor, "_FakeTensor": FakeTensor,
    }
    params, call = [], []
    star = False
    for i, p in enumerate(signature.parameters.values()):
        if p.kind is inspect.Parameter.KEYWORD_ONLY and not star:
            params.append("*")
            star = True
        if p.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            raise ValueError(f"{body.__qualname__}: argument {p.name!r} must be positional-or-keyword or "
                             "keyword-only")
        if p.default is inspect.Parameter.empty:
            params.append(p.name)
        else:
            namespace[f"_default{i}"] = p.default
            params.append(f"{p.name}=_default{i}")
        call.append(p.name if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD else f"{p.name}={p.name}")
    values = "(" + "".join(f"{n}, " for n in names) + ")"
    source = (f"def {body.__name__}({', '.join(params)}):\n"
              f"    if _dynamo() or _compiler._is_compiling_flag:\n"
              f"        if not getattr(_on_meta, 'active', False):\n"
              f"            return _lower({values})\n"
              f"    elif type({first}) is not _Tensor and isinstance({first}, _FakeTensor):\n"
              f"        return _lower({values})\n"
              f"    return _body({', '.join(call)})\n")
    exec(source, namespace)  # made of the signature's own identifiers
    public = namespace[body.__name__]
    for attribute in ("__module__", "__qualname__", "__doc__", "__annotations__"):
        setattr(public, attribute, getattr(body, attribute))
    public.__wrapped__ = body
    return public
