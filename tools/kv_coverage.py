"""Which KV caches each text-generation architecture of a vLLM tree builds, and
which of them declare their TP replication (docs/kv-replication-coverage.md).

Reads the tree's source only (no import of vLLM): every architecture of the
model registry's text-generation and speculative-decoding tables (through the
entry packages under vllm/models/, on every platform branch of their
imports), the classes and functions its model class reaches (what its code
builds or names: its own members and those it inherits without overriding,
the overridden ones it calls through `super()`, helpers, factories and tables
of layer classes, across modules), and the KV cache layers among them
(subclasses of AttentionLayerBase, and the caches those build themselves). A
cache layer declares replication when:

- it is `Attention` (or a subclass whose spec keeps the claim) built with
  `kv_proj=`: GQA attention that takes its claim from the projection's quant
  method (QKVParallelLinear.kv_max_tp_shards);
- it is another cache layer whose class (or what it inherits) builds its spec
  with a constant `max_tp_shards` or `tp_replicated=True`, or returns True from
  `is_kv_cache_tp_replicated`: caches written from TP-replicated projections
  (MLA, indexers, DeepSeek-V4, Zaya's CCA state).

A class that calls `declare_kv_proj(None)` withdraws the claim of the GQA
caches it reaches; they read undeclared at that class. Where the call is not a
plain statement of its `__init__` (it sits in a config branch or a helper),
the tool cannot tell when it applies, so it lists the withdrawal next to the
claim: the model reads `some`, not `all`. Declaring again with
`declare_kv_proj(<projection>)` (after replacing the projection) claims
nothing more than the `kv_proj=` the layer was built with.

    python tools/kv_coverage.py build/vllm-0.34.0            # print the page
    python tools/kv_coverage.py build/vllm-0.34.0 --write F  # write it to F
    python tools/kv_coverage.py build/vllm-0.34.0 --check F  # exit 1 if F differs
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

BASE_CLASS = ("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase")
ATTENTION = ("vllm.model_executor.layers.attention.attention", "Attention")
REGISTRY = "vllm.model_executor.models.registry"
TABLES = ("_TEXT_GENERATION_MODELS", "_SPECULATIVE_DECODING_MODELS")

# Why a reviewed cache layer does not declare, by (the class that builds or
# withdraws it, the cache layer class): the reasons the series states in the
# model code, where the declaration would go. Every other undeclared layer
# reads "not reviewed".
_DASH = (
    "the cache also holds the `DashRouter`'s head, which `qkv_proj` does not produce"
)
REASONS: dict[tuple[str, str], str] = {
    ("commandr.CohereAttention", "Attention"): (
        "with `use_qk_norm`, `k_norm` rows are loaded at `tp_rank`, not at the"
        " KV head the rank holds: ranks sharing a head normalize it differently"
    ),
    ("internlm2.InternLM2Attention", "Attention"): (
        "`wqkv` is loaded fused and split by rank after an all-gather, not by KV head"
    ),
    ("minimax_m2.MiniMaxM2Attention", "Attention"): (
        "TP-sharded full-width `k_norm` with an all-reduced variance: identical"
        " only if every all-reduce backend is bitwise reproducible (not proven"
        " for ROCm's fused path)"
    ),
    ("llama4.Llama4Attention", "Attention"): (
        "the RoPE layers' `ChunkedLocalAttention` cannot declare; declaring only"
        " the global (NoPE) layers gains nothing"
    ),
    ("llama4.Llama4Attention", "ChunkedLocalAttention"): (
        "builds its own spec and takes no projection"
    ),
    **{
        (f"models.minimax_m3.{platform}.model.MiniMaxM3DecoderLayer", layer): (
            "sparse layers build their own spec, from a fused QKV + indexer"
            " projection: a `QKVParallelLinear` subclass with its own row layout,"
            " which claims nothing"
        )
        for platform in ("nvidia", "amd")
        for layer in ("MiniMaxM3SparseAttention",)
    },
    ("models.minimax_m3.common.dspark.MiniMaxM3DSparkAttention", "Attention"): (
        "withdrawn (`declare_kv_proj(None)`): the draft tokens' K/V are written"
        " by the fused QK-norm/RoPE/KV-insert kernel and the context K/V by"
        " `DSparkContextKVWriter`, neither checked for ranks sharing a KV head"
    ),
    ("qwen3_dflash.DFlashQwen3Model", "Attention"): (
        "withdrawn (`declare_kv_proj(None)`) with ModelOpt MXFP8 weights: the"
        " context K/V reach the cache through one MXFP8 context projection, not"
        " the layers' QKV projections, and MXFP8 is not proven"
    ),
    ("models.beam.amd.attention.BeamAttention", "Attention"): (
        "the fused `beam_qk_norm_rope` kernel normalizes, ropes and may write"
        " K/V into the cache, and with `merged_qkv_gate` K/V come from a"
        " `MergedColumnParallelLinear`: neither checked"
    ),
    ("models.step5.amd.model.Step5Attention", "Attention"): (
        "standard K/V path, but the module needs a ROCm GPU to import, so no"
        " test builds it"
    ),
    ("ricursive.RicursiveAttention", "Attention"): (
        "TP must divide its KV heads, so no rank repeats another's head (and"
        " K/V do not come from a `QKVParallelLinear`)"
    ),
    ("model_executor.layers.dash_attention.DASHAttention", "Attention"): _DASH,
    ("model_executor.layers.dash_attention.DASHAttention", "RSWAAttention"): _DASH,
    ("zaya.ZayaAttention", "Attention"): (
        "TP does not shard this attention (every rank computes every head from"
        " `ZayaCCA`'s replicated projections), but `Attention` declares only"
        " through a `QKVParallelLinear`"
    ),
}
# Cache layers whose state TP shards by head (MambaBase without
# is_kv_cache_tp_replicated): never replicated, nothing to declare.
SHARDED_STATE = "state sharded by head across TP ranks: each rank holds its own"
MAMBA_BASE = ("vllm.model_executor.layers.mamba.abstract", "MambaBase")

Ref = tuple[str, str]  # (module, name)
Scope = list[tuple[Ref, ast.AST]]  # (the class or function it is of, code)


@dataclass
class Module:
    name: str
    tree: ast.Module
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    # local name -> what it imports, in every branch (a platform pick imports
    # one name from several modules)
    imports: dict[str, list[Ref]] = field(default_factory=dict)
    # Module-level names bound to an expression (aliases, tables of layer
    # classes), in every branch of top-level if/try blocks.
    variables: dict[str, ast.expr] = field(default_factory=dict)


def _top_level(body: list[ast.stmt]):
    """Statements at module level, including those in if/try blocks (only the
    `else` of `if TYPE_CHECKING:`, what runs)."""
    for node in body:
        if isinstance(node, ast.If):
            if _called_name(node.test) != "TYPE_CHECKING" or not node.orelse:
                yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _top_level(block)
            for handler in node.handlers:
                yield from _top_level(handler.body)
        else:
            yield node


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def load(root: Path) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted((root / "vllm").rglob("*.py")):
        name = module_name(root, path)
        tree = ast.parse(path.read_text(), str(path))
        mod = Module(name, tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    source = ".".join(base + ([source] if source else []))
                for alias in node.names:
                    refs = mod.imports.setdefault(alias.asname or alias.name, [])
                    if (source, alias.name) not in refs:
                        refs.append((source, alias.name))
        for node in _top_level(tree.body):
            if isinstance(node, ast.ClassDef):
                mod.classes.setdefault(node.name, node)
            elif isinstance(node, ast.FunctionDef):
                mod.functions.setdefault(node.name, node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value:
                targets = (
                    node.targets if isinstance(node, ast.Assign) else [node.target]
                )
                for target in targets:
                    if isinstance(target, ast.Name):
                        mod.variables[target.id] = node.value
        modules[name] = mod
    return modules


def _called_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _mentions(node: ast.AST, name: str) -> bool:
    return any(
        (isinstance(sub, ast.keyword) and sub.arg == name) or _called_name(sub) == name
        for sub in ast.walk(node)
    )


class Index:
    def __init__(self, root: Path):
        self.modules = load(root)
        self._cache_layer: dict[Ref, bool] = {}
        self._resolved: dict[Ref, tuple[Ref, ...]] = {}
        self._mro: dict[Ref, list[Ref]] = {}
        self._direct: dict[Ref, tuple[set[Cache], list[Ref]]] = {}
        self._withdrawals: dict[Ref, list[tuple[Ref, bool]]] = {}
        self._withdrawn: dict[Ref, set[Cache]] = {}

    def resolve(self, module: str, name: str, depth: int = 0) -> tuple[Ref, ...]:
        """Where `name`, as module `module` sees it, is defined: every
        definition it imports, on any branch."""
        key = (module, name)
        if key not in self._resolved:
            self._resolved[key] = ()  # while resolving: an import cycle
            self._resolved[key] = self._resolve(module, name, depth)
        return self._resolved[key]

    def _resolve(self, module: str, name: str, depth: int) -> tuple[Ref, ...]:
        mod = self.modules.get(module)
        if mod is None or depth > 8:
            return ()
        if name in mod.classes or name in mod.functions or name in mod.variables:
            return ((module, name),)
        out: list[Ref] = []
        for source, original in mod.imports.get(name, ()):
            if f"{source}.{original}" in self.modules:
                continue  # a module, not a class
            for ref in self.resolve(source, original, depth + 1):
                if ref not in out:
                    out.append(ref)
        return tuple(out)

    def class_def(self, ref: Ref) -> ast.ClassDef | None:
        mod = self.modules.get(ref[0])
        return mod.classes.get(ref[1]) if mod else None

    def bases(self, ref: Ref) -> list[Ref]:
        mod = self.modules.get(ref[0])
        node = self.class_def(ref)
        if node is None and mod is not None and ref[1] in mod.variables:
            # An alias (`Base = LlamaForCausalLM`): what it names.
            names = [
                sub.id
                for sub in ast.walk(mod.variables[ref[1]])
                if isinstance(sub, ast.Name)
            ]
        elif node is not None:
            names = [name for base in node.bases if (name := _called_name(base))]
        else:
            return []
        out: list[Ref] = []
        for name in names:
            for target in self.resolve(ref[0], name):
                if target != ref and target not in out:
                    out.append(target)
        return out

    def ancestry(self, ref: Ref) -> list[Ref]:
        seen, todo = [], [ref]
        while todo:
            cur = todo.pop()
            if cur not in seen:
                seen.append(cur)
                todo.extend(self.bases(cur))
        return seen

    def class_bases(self, ref: Ref, depth: int = 0) -> list[Ref]:
        """The classes `ref` derives from directly, through aliases."""
        out: list[Ref] = []
        for base in self.bases(ref):
            if self.class_def(base) is not None:
                found = [base]
            elif depth < 4:
                found = self.class_bases(base, depth + 1)
            else:
                found = []
            out.extend(b for b in found if b not in out)
        return out

    def mro(self, ref: Ref) -> list[Ref]:
        """The classes of `ref`'s method resolution order that the tree defines
        (C3; depth-first where C3 fails)."""
        if ref in self._mro:
            return self._mro[ref]
        self._mro[ref] = [ref]  # while linearizing: a cycle
        parents = self.class_bases(ref)
        seqs = [list(self.mro(p)) for p in parents] + [list(parents)]
        out = [ref]
        while seqs := [s for s in seqs if s]:
            head = next(
                (s[0] for s in seqs if not any(s[0] in t[1:] for t in seqs)), None
            )
            if head is None:
                out.extend(c for s in seqs for c in s if c not in out)
                break
            if head not in out:
                out.append(head)
            for s in seqs:
                if s[0] == head:
                    s.pop(0)
        self._mro[ref] = out
        return out

    def members(self, ref: Ref) -> list[tuple[str, ast.AST]]:
        """A class's own body by member name ("" for what no name binds)."""
        node = self.class_def(ref)
        out: list[tuple[str, ast.AST]] = []
        for stmt in node.body if node else []:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.append((stmt.name, stmt))
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                if stmt.value is None:
                    continue
                targets = (
                    stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                )
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                out.extend((name, stmt) for name in names or [""])
            else:
                out.append(("", stmt))
        return out

    def view(self, ref: Ref) -> Scope:
        """The code a class runs as its own: each member from the first class
        of its MRO that defines it, and what that member reaches of the
        definitions it overrides (`super().name(...)`, `Base.name(self, ...)`;
        `nn.Module.__init__(self)` ends an `__init__`)."""
        mro = self.mro(ref)
        out: Scope = []
        first: dict[str, int] = {}
        for i, owner in enumerate(mro):
            for name, node in self.members(owner):
                if not name:
                    out.append((owner, node))
                first.setdefault(name, i)
        for name, i in first.items():
            if name:
                out.extend(self._chain(mro, name, i))
        return out

    def _chain(self, mro: list[Ref], member: str, start: int, depth: int = 0) -> Scope:
        out: Scope = []
        done: set[int] = set()
        todo: list[int | None] = [start]
        while todo:
            i = todo.pop()
            if i is None or i in done:
                continue
            done.add(i)
            owner = mro[i]
            for name, node in self.members(owner):
                if name != member:
                    continue
                out.append((owner, node))
                for call in ast.walk(node):
                    if not (
                        isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Attribute)
                        and call.func.attr == member
                    ):
                        continue
                    target = call.func.value
                    if (
                        isinstance(target, ast.Call)
                        and _called_name(target.func) == "super"
                    ):
                        after = i
                        if target.args and (cls_name := _called_name(target.args[0])):
                            for cls in self.resolve(owner[0], cls_name):
                                if cls in mro:
                                    after = mro.index(cls)
                        todo.append(self._next_def(mro, member, after + 1))
                        continue
                    cls_name = _called_name(target)
                    for cls in self.resolve(owner[0], cls_name) if cls_name else ():
                        if cls in mro:
                            todo.append(self._next_def(mro, member, mro.index(cls)))
                        elif self.class_def(cls) is not None and depth < 4:
                            base_mro = self.mro(cls)
                            found = self._next_def(base_mro, member, 0)
                            if found is not None:
                                out.extend(
                                    self._chain(base_mro, member, found, depth + 1)
                                )
        return out

    def _next_def(self, mro: list[Ref], member: str, start: int) -> int | None:
        for i in range(start, len(mro)):
            if any(name == member for name, _ in self.members(mro[i])):
                return i
        return None

    def products(self, module: str, func: ast.expr, scope: Scope) -> list[Ref]:
        """The cache layer classes that a call through `func` builds when
        `func` is not a name: a factory's call (`pick_attn_cls(config)(...)`,
        `self._get_cache_cls()(...)`: the classes it returns) or a table's
        entry (`LAYERS[kind](...)`)."""
        out: list[Ref] = []
        if isinstance(func, ast.Call) and (name := _called_name(func.func)):
            factories = [
                (fn[0], node)
                for fn in self.resolve(module, name)
                if (node := self.modules[fn[0]].functions.get(fn[1]))
            ]
            if isinstance(func.func, ast.Attribute):
                factories += [
                    (owner[0], node)
                    for owner, node in scope
                    if isinstance(node, ast.FunctionDef) and node.name == name
                ]
            for where, node in factories:
                for ret in ast.walk(node):
                    if isinstance(ret, ast.Return) and ret.value is not None:
                        out.extend(self._named_layers(where, ret.value))
        elif isinstance(func, ast.Subscript) and (name := _called_name(func.value)):
            for table in self.resolve(module, name):
                value = self.modules[table[0]].variables.get(table[1])
                if value is not None:
                    out.extend(self._named_layers(table[0], value))
        return out

    def _named_layers(self, module: str, expr: ast.expr) -> list[Ref]:
        return [
            target
            for sub in ast.walk(expr)
            if (name := _called_name(sub))
            and isinstance(sub, (ast.Name, ast.Attribute))
            for target in self.resolve(module, name)
            if self.is_cache_layer(target)
        ]

    def is_cache_layer(self, ref: Ref) -> bool:
        if ref not in self._cache_layer:
            self._cache_layer[ref] = BASE_CLASS in self.ancestry(ref)[1:]
        return self._cache_layer[ref]

    def declares_itself(self, ref: Ref) -> bool:
        """A cache layer whose class builds its spec (in code it has or
        inherits) with a constant max_tp_shards, or declares TP-replicated
        Mamba state."""
        _, found = self.definition(ref, "is_kv_cache_tp_replicated")
        returns = [r for n in found for r in ast.walk(n) if isinstance(r, ast.Return)]
        if returns and all(
            isinstance(r.value, ast.Constant) and r.value.value is True for r in returns
        ):
            return True
        for _, node in self.view(ref):
            for sub in ast.walk(node):
                if isinstance(sub, ast.keyword) and isinstance(sub.value, ast.Constant):
                    value = sub.value.value
                    if sub.arg == "max_tp_shards" and isinstance(value, int):
                        return True
                    if sub.arg == "tp_replicated" and value is True:
                        return True
        return False

    def spec_takes_kv_proj(self, ref: Ref) -> bool:
        """An Attention (subclass) whose spec carries what kv_proj proves: the
        spec Attention builds, or an override that passes max_tp_shards."""
        owner, found = self.definition(ref, "get_kv_cache_spec")
        return bool(found) and (
            owner == ATTENTION or any(_mentions(n, "max_tp_shards") for n in found)
        )

    def definition(self, ref: Ref, member: str) -> tuple[Ref | None, list[ast.AST]]:
        """The first class of `ref`'s MRO that defines `member`, and its
        definitions there; (None, []) where none does."""
        for owner in self.mro(ref):
            found = [node for name, node in self.members(owner) if name == member]
            if found:
                return owner, found
        return None, []

    def withdrawals(self, ref: Ref) -> list[tuple[Ref, bool]]:
        """Where class or function `ref` calls `declare_kv_proj(None)`: (the
        class it is in, whether it is a plain statement of an `__init__`)."""
        direct(self, ref)
        return self._withdrawals.get(ref, [])


@dataclass(frozen=True)
class Cache:
    layer: str  # the cache layer class
    site: str  # module.Class (or module.function) that builds it
    declared: bool
    sharded_state: bool = False  # head-sharded Mamba-style state
    gqa: bool = False  # an Attention (its claim is kv_proj's)


def site_name(ref: Ref) -> str:
    """`module.Class` of a class or function, relative to the model packages."""
    module = ref[0].removeprefix("vllm.model_executor.models.").removeprefix("vllm.")
    return f"{module}.{ref[1]}"


def caches_of(index: Index, arch: Ref) -> set[Cache]:
    """The KV cache layers that `arch`'s model class reaches (through its
    entry package's imports, every platform's)."""
    found: set[Cache] = set()
    for ref in index.resolve(*arch) or (arch,):
        found |= reachable_caches(index, ref)
    return found


def reachable_caches(index: Index, start: Ref, own: bool = False) -> set[Cache]:
    """The caches `start` builds and reaches; with `own`, before `start`'s
    own withdrawals."""
    found: set[Cache] = set()
    seen: set[Ref] = set()
    todo: list[Ref] = [start]
    while todo:
        ref = todo.pop()
        if ref in seen:
            continue
        seen.add(ref)
        if index.withdrawals(ref) and not (own and ref == start):
            found |= withdrawn_caches(index, ref)
            continue
        caches, reached = direct(index, ref)
        found |= caches
        todo.extend(r for r in reached if r not in seen)
    return found


def withdrawn_caches(index: Index, ref: Ref) -> set[Cache]:
    """What a class that calls `declare_kv_proj(None)` reaches: its GQA caches
    undeclared at the class that withdraws them; where the withdrawal is not
    unconditional, next to the claim."""
    if ref not in index._withdrawn:
        index._withdrawn[ref] = set()  # while computing: a cycle
        out: set[Cache] = set()
        withdrawals = index.withdrawals(ref)
        for c in reachable_caches(index, ref, own=True):
            if not (c.gqa and c.declared):
                out.add(c)
                continue
            for owner, _ in withdrawals:
                out.add(Cache(c.layer, site_name(owner), False, gqa=True))
            if not any(always for _, always in withdrawals):
                out.add(c)
        index._withdrawn[ref] = out
    return index._withdrawn[ref]


def direct(index: Index, ref: Ref) -> tuple[set[Cache], list[Ref]]:
    """The cache layers that class or function `ref` builds itself (in the
    code it runs as its own), and the classes and functions it reaches (what
    it builds or names)."""
    if ref in index._direct:
        return index._direct[ref]
    caches: set[Cache] = set()
    reached: list[Ref] = []
    withdrawals: list[tuple[Ref, bool]] = []
    mod = index.modules[ref[0]]
    scope: Scope
    if ref[1] in mod.classes:
        scope = index.view(ref)
    else:
        node = mod.functions.get(ref[1]) or mod.variables.get(ref[1])
        scope = [(ref, node)] if node is not None else []
    index._direct[ref] = (caches, reached)  # while walking: a cycle
    # What it inherits is in its scope already.
    inherited = set(index.mro(ref)) if ref[1] in mod.classes else {ref}
    for owner, node in scope:
        site = site_name(owner)
        read_only = _attribute_reads(node)
        init_body = (
            node.body
            if isinstance(node, ast.FunctionDef) and node.name == "__init__"
            else []
        )
        for sub in ast.walk(node):
            if id(sub) in read_only:
                continue
            if isinstance(sub, ast.Call) and _withdraws(sub):
                always = any(
                    isinstance(s, ast.Expr) and s.value is sub for s in init_body
                )
                withdrawals.append((owner, always))
            name = None
            if isinstance(sub, ast.Name):
                name = sub.id
            elif isinstance(sub, ast.Call):
                name = _called_name(sub.func)
                for target in index.products(owner[0], sub.func, scope):
                    caches.add(cache(index, target, site, sub))
            for target in index.resolve(owner[0], name) if name else ():
                if index.is_cache_layer(target):
                    if isinstance(sub, ast.Call):
                        caches.add(cache(index, target, site, sub))
                    elif target != owner:
                        # Named, not built here (e.g. `attn_cls = Attention`):
                        # built through that name, the kwargs are at the call.
                        caches.update(indirect_builds(index, scope, name, target))
                if target not in inherited:
                    # A cache layer too: what it builds (caches of its own).
                    reached.append(target)
    if withdrawals:
        index._withdrawals[ref] = withdrawals
    return caches, reached


def _attribute_reads(node: ast.AST) -> set[int]:
    """Names only read from (`Model.hf_to_vllm_mapper`): nothing built."""
    called = {id(sub.func) for sub in ast.walk(node) if isinstance(sub, ast.Call)}
    return {
        id(sub.value)
        for sub in ast.walk(node)
        if isinstance(sub, ast.Attribute)
        and isinstance(sub.value, ast.Name)
        and id(sub) not in called
    }


def _withdraws(call: ast.Call) -> bool:
    return (
        _called_name(call.func) == "declare_kv_proj"
        and isinstance(call.func, ast.Attribute)
        and len(call.args) == 1
        and isinstance(call.args[0], ast.Constant)
        and call.args[0].value is None
    )


def cache(index: Index, layer: Ref, site: str, call: ast.Call) -> Cache:
    ancestry = index.ancestry(layer)
    gqa = ATTENTION in ancestry
    if gqa:
        declared = any(
            k.arg == "kv_proj"
            and not (isinstance(k.value, ast.Constant) and k.value.value is None)
            for k in call.keywords
        ) and index.spec_takes_kv_proj(layer)
    else:
        declared = index.declares_itself(layer)
    return Cache(layer[1], site, declared, MAMBA_BASE in ancestry and not declared, gqa)


def indirect_builds(index: Index, scope: Scope, name: str, target: Ref) -> set[Cache]:
    """A cache layer class bound to a variable or attribute, then called
    through it (not an instance of it called)."""
    bound = set()
    for _, node in scope:
        for sub in ast.walk(node):
            if not isinstance(sub, (ast.Assign, ast.AnnAssign)) or sub.value is None:
                continue
            callees = {
                id(c.func) for c in ast.walk(sub.value) if isinstance(c, ast.Call)
            }
            if not any(
                isinstance(v, ast.Name) and v.id == name and id(v) not in callees
                for v in ast.walk(sub.value)
            ):
                continue
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
            bound.update(t for t in map(_called_name, targets) if t)
    out = set()
    for owner, node in scope:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call) and _called_name(sub.func) in bound:
                out.add(cache(index, target, site_name(owner), sub))
    return out


def registry(index: Index) -> dict[str, Ref]:
    archs: dict[str, Ref] = {}
    tree = index.modules[REGISTRY].tree
    for node in tree.body:
        if not (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in TABLES
        ):
            continue
        table = ast.literal_eval(node.value)
        for arch, (module, cls) in table.items():
            if not module.startswith("vllm."):
                module = f"vllm.model_executor.models.{module}"
            archs[arch] = (module, cls)
    return archs


PROVEN = (
    "bf16/fp16; FP8 checkpoints per tensor, or in blocks aligned to the rank's"
    " heads; `fp8_per_tensor`, `fp8_per_channel`; `fp8_per_block` when a rank's"
    " Q rows fill whole 128-row blocks"
)


def row(arch: str, caches: list[Cache]) -> tuple[str, str]:
    layers = sorted({c.layer for c in caches})
    if not caches:
        status = "no cache"
    elif all(c.declared for c in caches):
        status = "all"
    elif any(c.declared for c in caches):
        status = "some"
    else:
        status = "none"
    at_site: dict[str, set[str]] = {}
    for c in caches:
        at_site.setdefault(c.site, set()).add(c.layer)

    def where(c: Cache) -> str:
        # The layer too where one class builds several kinds of cache layer.
        label = f"`{c.site}`"
        return label if len(at_site[c.site]) == 1 else f"{label} (`{c.layer}`)"

    declared = sorted({where(c) for c in caches if c.declared})
    reasons: dict[str, str] = {}
    for c in caches:
        if not c.declared:
            default = SHARDED_STATE if c.sharded_state else "not reviewed"
            reasons.setdefault(where(c), REASONS.get((c.site, c.layer), default))
    why = "; ".join(f"{label}: {reasons[label]}" for label in sorted(reasons))
    return (
        f"| `{arch}` | {', '.join(f'`{x}`' for x in layers) or '-'} | {status}"
        f" | {', '.join(declared) or '-'} | {why or '-'} |"
    ), status


def page(root: Path, index: Index | None = None) -> str:
    index = index or Index(root)
    rows = []
    counts = {"all": 0, "some": 0, "none": 0, "no cache": 0}
    for arch, ref in sorted(registry(index).items()):
        caches = sorted(
            (c for c in caches_of(index, ref) if c.layer != "EncoderOnlyAttention"),
            key=lambda c: (c.layer, c.site, c.declared),
        )
        text, status = row(arch, caches)
        counts[status] += 1
        rows.append(text)
    header = f"""# KV cache TP replication: coverage by architecture

Generated by `tools/kv_coverage.py` from `{root.name}` (the release with this
project's series): do not edit by hand; `tests/test_kv_coverage.py` fails when
this page and the code disagree.

For every architecture of vLLM's text-generation and speculative-decoding
registries: the KV cache layers its model's code can build (on any platform
or config branch, so some models list layers that only other configs use),
whether they declare which TP ranks hold identical KV
(`AttentionSpec.max_tp_shards`, or TP-replicated Mamba state), and where they
are built. Only declared caches can be stored once per
group of identical ranks by the KV offloading connector; an undeclared cache
costs that deduplication, never correctness.

- GQA attention declares through its projection (`Attention(kv_proj=...)`), for
  the weight quantization methods proven to keep ranks that share a KV head
  identical: {PROVEN}. Any other method claims nothing at run time.
- Caches written from TP-replicated projections (MLA latents, indexers,
  DeepSeek-V4) declare in their own spec, for every quantization method (every
  rank quantizes the same full weight).
- A model that writes a GQA cache some other way too withdraws the claim
  (`declare_kv_proj(None)`): that cache reads undeclared at the class that
  withdraws it, next to the claim where only some configs withdraw it.
- Status: `all` every cache the model builds declares; `some` part of them
  (the model's `kv_tp_replicas` is then 1 unless the others are replicated
  too); `none`; `no cache` (encoder-only, or nothing found). Where one class
  builds several kinds of cache layer, the layer follows the class.

Architectures: {sum(counts.values())}; all declared: {counts["all"]}, some: \
{counts["some"]}, none: {counts["none"]}, no KV cache found: {counts["no cache"]}.

| Architecture | KV cache layers | Declares | Declared at | Not declared at, and why |
| --- | --- | --- | --- | --- |
"""
    return header + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", type=Path)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path)
    group.add_argument("--check", type=Path)
    args = parser.parse_args(argv)
    text = page(args.tree.resolve())
    if args.write:
        args.write.write_text(text)
    elif args.check:
        if not args.check.exists() or args.check.read_text() != text:
            print(
                f"{args.check} is not what tools/kv_coverage.py makes of "
                f"{args.tree}: run `python tools/kv_coverage.py {args.tree} "
                f"--write {args.check}` and review the difference",
                file=sys.stderr,
            )
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
