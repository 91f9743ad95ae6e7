"""No Cypher text in the code base is built from anything but constants.

Every call that sends Cypher to Neo4j (`<x>.run(query, ...)`, `<x>.execute_query(query, ...)`)
is found in the sources of libs/, services/ and cli/, and its query argument must be a
constant: a string literal, or an expression built only from literals and constants (module or
class constants, tuples or dicts of them, f-strings and `+` of them, a loop over them, an item
of them). When the query is a parameter of the function making the call (a helper such as
`_run(tx, query, **params)`), every call of that helper must pass a constant in its place,
followed through as many helpers as there are, including transaction functions handed to
`execute_read`/`execute_write` with their arguments. Anything the analysis cannot prove constant
is a violation, so a new way of building queries fails here until it is shown to be safe.

User input therefore only ever reaches Neo4j as query parameters. `test_the_checker_*` show
that the analysis does catch queries built from input.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_GLOBS = ("libs/*/src/**/*.py", "services/*/src/**/*.py", "cli/src/**/*.py")
#: Methods that send their first argument to Neo4j as Cypher, and the keyword naming it.
SINKS = {"run": "query", "execute_query": "query_"}
#: Methods that call a transaction function with the arguments after it.
TRANSACTION_RUNNERS = {"execute_read", "execute_write"}
#: `.run(` receivers that are never Neo4j sessions or transactions.
NOT_NEO4J = {"asyncio", "subprocess", "trio", "anyio"}
#: Builtins whose result is constant when their arguments are.
PURE_BUILTINS = {"sorted", "tuple", "list", "set", "frozenset", "str", "reversed", "enumerate"}


@dataclass(frozen=True)
class Param:
    """The query is this parameter of `function`: its callers decide."""

    module: Module
    function: ast.FunctionDef | ast.AsyncFunctionDef
    name: str


@dataclass(frozen=True)
class Tainted:
    reason: str


Resolved = Param | Tainted | None  # None: constant


@dataclass
class Module:
    path: Path
    name: str
    tree: ast.Module
    imports_neo4j: bool
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, name: str, source: str | None = None) -> Module:
        tree = ast.parse(source if source is not None else path.read_text(), str(path))
        imports_neo4j = any(
            (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "neo4j" for a in n.names))
            or (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "neo4j")
            for n in ast.walk(tree)
        )
        module = cls(path, name, tree, imports_neo4j)
        for parent in ast.walk(tree):
            for child in ast.iter_child_nodes(parent):
                module.parents[child] = parent
        return module

    def where(self, node: ast.AST) -> str:
        return f"{self.path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"

    def enclosing(self, node: ast.AST) -> list[ast.AST]:
        """Functions and classes around `node`, innermost first, then the module."""
        chain: list[ast.AST] = []
        current = self.parents.get(node)
        while current is not None:
            if isinstance(current, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                chain.append(current)
            current = self.parents.get(current)
        chain.append(self.tree)
        return chain


class CypherChecker:
    """Finds every Cypher call and proves its query constant, or reports why it cannot."""

    def __init__(self, modules: list[Module]) -> None:
        self.modules = modules
        self.by_name = {m.name: m for m in modules}
        self.violations: list[str] = []
        self.checked_calls = 0
        self._seen_params: set[tuple[str, int, str]] = set()

    # --- entry point ----------------------------------------------------------------------------

    def check(self) -> list[str]:
        for module in self.modules:
            for call in _calls(module.tree):
                query = self._sink_query(module, call)
                if query is False:
                    continue
                self.checked_calls += 1
                if query is None:
                    self._violation(module, call, "the query argument is not visible")
                    continue
                self._require_constant(module, query, call)
        return self.violations

    # --- sinks ----------------------------------------------------------------------------------

    def _sink_query(self, module: Module, call: ast.Call) -> ast.expr | bool | None:
        """The query expression of a Cypher call; False when `call` sends no Cypher."""
        func = call.func
        if not isinstance(func, ast.Attribute) or func.attr not in SINKS:
            return False
        if func.attr == "run":
            receiver = func.value
            if isinstance(receiver, ast.Name) and receiver.id in NOT_NEO4J:
                return False
            if not (module.imports_neo4j or _looks_like_session(receiver)):
                return False
        if call.args and not isinstance(call.args[0], ast.Starred):
            return call.args[0]
        keyword = SINKS[func.attr]
        return next((k.value for k in call.keywords if k.arg == keyword), None)

    # --- proof ----------------------------------------------------------------------------------

    def _require_constant(self, module: Module, expr: ast.expr, site: ast.AST) -> None:
        resolved = self._resolve(module, expr, set())
        if isinstance(resolved, Tainted):
            self._violation(module, site, resolved.reason)
        elif isinstance(resolved, Param):
            self._require_callers_constant(resolved, site)

    def _require_callers_constant(self, param: Param, site: ast.AST) -> None:
        function, module = param.function, param.module
        key = (str(module.path), function.lineno, param.name)
        if key in self._seen_params:
            return
        self._seen_params.add(key)
        names = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
        if param.name not in names:
            self._violation(module, site, f"query comes from *args/**kwargs of {function.name}")
            return
        index = names.index(param.name)
        is_method = bool(names) and names[0] in {"self", "cls"}
        for caller_module in self._modules_calling(module, function.name):
            for node in ast.walk(caller_module.tree):
                if isinstance(node, ast.Call):
                    argument = _argument_for(node, function.name, param.name, index, is_method)
                    if argument is _NOT_THIS_FUNCTION:
                        continue
                    if argument is None:
                        self._violation(
                            caller_module,
                            node,
                            f"cannot see which query is passed to {function.name}",
                        )
                    else:
                        assert isinstance(argument, ast.expr)
                        self._require_constant(caller_module, argument, node)
                elif (
                    _refers_to(node, function.name)
                    and not _is_called_or_run(caller_module, node)
                    and not _local_name(caller_module, node)
                ):
                    # A bound method takes the query one position earlier than its definition.
                    bound = is_method and isinstance(node, ast.Attribute)
                    query_at = index - 1 if bound else index
                    if not self._follow_handed_over(
                        caller_module, node, query_at, param.name, function.name
                    ):
                        self._violation(
                            caller_module,
                            node,
                            f"{function.name} takes a query and is passed around as a value",
                        )

    def _follow_handed_over(
        self, module: Module, ref: ast.AST, query_at: int, query_param: str, helper: str
    ) -> bool:
        """`ref`, a helper taking a query at argument `query_at`, is an argument of a call of a
        function or class of the code base: every call of the parameter receiving it, directly
        or through the instance attribute it is stored in, must pass a constant there. False
        when the helper goes anywhere else (the caller reports it)."""
        call = module.parents.get(ref)
        if not isinstance(call, ast.Call) or call.func is ref:
            return False
        target = self._callee(module, call.func)
        if target is None:
            return False
        target_module, function, skip_self = target
        names = [a.arg for a in (*function.args.posonlyargs, *function.args.args)][skip_self:]
        keyword = next((k.arg for k in call.keywords if k.value is ref), None)
        if keyword is None and ref in call.args and call.args.index(ref) < len(names):
            keyword = names[call.args.index(ref)]
        if keyword is None:
            return False
        holder = _Holder(target_module, function, keyword, query_at, query_param, helper)
        for use in holder.uses():
            if isinstance(use, ast.expr):
                self._require_constant(target_module, use, use)
            else:
                self._violation(target_module, use[0], use[1])
        return True

    def _callee(
        self, module: Module, func: ast.expr
    ) -> tuple[Module, ast.FunctionDef | ast.AsyncFunctionDef, int] | None:
        """The function a call runs (a class: its __init__, `self` skipped), if it is defined
        at the top of a module of the code base."""
        if not isinstance(func, ast.Name):
            return None
        target_module, target_name = module, func.id
        imported = self._imported(module, func.id)
        if imported is not None:
            target_module, target_name = imported
        for node in target_module.tree.body:
            if (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and node.name == target_name
            ):
                return target_module, node, 0
            if isinstance(node, ast.ClassDef) and node.name == target_name:
                init = next(
                    (
                        n
                        for n in node.body
                        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                        and n.name == "__init__"
                    ),
                    None,
                )
                return (target_module, init, 1) if init is not None else None
        return None

    def _modules_calling(self, module: Module, name: str) -> list[Module]:
        return [module] if name.startswith("_") else self.modules

    def _resolve(self, module: Module, expr: ast.expr, busy: set[tuple[int, str]]) -> Resolved:
        if isinstance(expr, ast.Constant):
            return (
                None
                if isinstance(expr.value, str | int | float | bool | type(None))
                else (Tainted(f"a constant of type {type(expr.value).__name__}"))
            )
        if isinstance(expr, ast.JoinedStr):
            return self._all(
                module, [v.value for v in expr.values if isinstance(v, ast.FormattedValue)], busy
            )
        if isinstance(expr, ast.BinOp):
            return self._all(module, [expr.left, expr.right], busy)
        if isinstance(expr, ast.Tuple | ast.List | ast.Set):
            return self._all(module, list(expr.elts), busy)
        if isinstance(expr, ast.Dict):
            return self._all(module, [v for v in expr.values if v is not None], busy)
        if isinstance(expr, ast.IfExp):
            return self._all(module, [expr.body, expr.orelse], busy)
        if isinstance(expr, ast.ListComp | ast.SetComp | ast.GeneratorExp):
            # Its loop variables are resolved like any binding: items of what they loop over.
            return self._all(module, [expr.elt], busy)
        if isinstance(expr, ast.DictComp):
            return self._all(module, [expr.key, expr.value], busy)
        if isinstance(expr, ast.Subscript):
            return self._resolve(module, expr.value, busy)  # any item of constants is constant
        if isinstance(expr, ast.Call):
            return self._resolve_call(module, expr, busy)
        if isinstance(expr, ast.Name):
            return self._resolve_name(module, expr, busy)
        if isinstance(expr, ast.Attribute):
            return self._resolve_attribute(module, expr, busy)
        return Tainted(f"built by {type(expr).__name__}, which is not a constant")

    def _all(self, module: Module, parts: list[ast.expr], busy: set[tuple[int, str]]) -> Resolved:
        for part in parts:
            resolved = self._resolve(module, part, busy)
            if resolved is not None:
                if isinstance(resolved, Param):
                    return Tainted(
                        f"parameter {resolved.name!r} of {resolved.function.name} is "
                        "spliced into the query text"
                    )
                return resolved
        return None

    def _resolve_call(self, module: Module, call: ast.Call, busy: set[tuple[int, str]]) -> Resolved:
        callee = call.func.attr if isinstance(call.func, ast.Attribute) else None
        if isinstance(call.func, ast.Name):
            callee = call.func.id
        if callee == "Query":  # neo4j.Query(text, metadata, timeout): only its text is Cypher
            text = (
                call.args[0]
                if call.args
                else next((k.value for k in call.keywords if k.arg == "text"), None)
            )
            if text is None:
                return Tainted("cannot see the text of this Query")
            return self._resolve(module, text, busy)
        # `CONSTANT.format(...)`, `" ".join(CONSTANTS)`, `CONSTANT.strip()`: methods of a
        # constant string with constant arguments.
        if isinstance(call.func, ast.Attribute):
            parts = [call.func.value, *call.args, *(k.value for k in call.keywords)]
            if self._all(module, parts, busy) is None:
                return None
        elif isinstance(call.func, ast.Name) and call.func.id in PURE_BUILTINS:
            parts = [*call.args, *(k.value for k in call.keywords)]
            if self._all(module, parts, busy) is None:
                return None
        return Tainted(f"{ast.unparse(call)} is not built from constants only")

    def _resolve_name(self, module: Module, name: ast.Name, busy: set[tuple[int, str]]) -> Resolved:
        for scope in module.enclosing(name):
            if isinstance(scope, ast.ClassDef):
                continue  # class bodies are not visible from their methods by bare name
            key = (id(scope), name.id)
            if key in busy:
                return None  # a cycle adds nothing not already being proven
            if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
                params = {a.arg for a in _all_args(scope)}
                if name.id in params:
                    return Param(module, scope, name.id)
            sources = list(_bindings(scope, name.id))
            if not sources:
                continue
            busy = busy | {key}
            for source in sources:
                if isinstance(source, Tainted):
                    return source
                resolved = self._resolve(module, source, busy)
                if resolved is not None:
                    return (
                        resolved
                        if isinstance(resolved, Tainted)
                        else Tainted(
                            f"{name.id!r} is bound to parameter {resolved.name!r} of "
                            f"{resolved.function.name}"
                        )
                    )
            return None
        imported = self._imported(module, name.id)
        if imported is not None:
            target_module, target_name = imported
            return (
                self._resolve_name(target_module, _name_in(target_module, target_name), busy)
                if _name_in(target_module, target_name) is not None
                else Tainted(f"{name.id!r} is not a constant of {target_module.name}")
            )
        return Tainted(f"{name.id!r} is not a constant defined in this code base")

    def _resolve_attribute(
        self, module: Module, attribute: ast.Attribute, busy: set[tuple[int, str]]
    ) -> Resolved:
        owner = attribute.value
        if isinstance(owner, ast.Name) and owner.id in {"self", "cls"}:
            cls = next(
                (s for s in module.enclosing(attribute) if isinstance(s, ast.ClassDef)), None
            )
            if cls is not None and not _assigned_on_instances(cls, attribute.attr):
                sources = list(_bindings(cls, attribute.attr))
                if sources and all(not isinstance(s, Tainted) for s in sources):
                    return self._all(module, [s for s in sources if isinstance(s, ast.expr)], busy)
            return Tainted(f"self.{attribute.attr} is not a class constant")
        if isinstance(owner, ast.Name):
            target = self._imported_module(module, owner.id)
            if target is not None:
                node = _name_in(target, attribute.attr)
                if node is not None:
                    return self._resolve_name(target, node, busy)
        return Tainted(f"{ast.unparse(attribute)} is not a constant defined in this code base")

    def _imported(self, module: Module, name: str) -> tuple[Module, str] | None:
        for node in module.tree.body:
            if isinstance(node, ast.ImportFrom) and node.module in self.by_name:
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.by_name[node.module], alias.name
        return None

    def _imported_module(self, module: Module, name: str) -> Module | None:
        for node in module.tree.body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if (alias.asname or alias.name) == name and alias.name in self.by_name:
                        return self.by_name[alias.name]
        return None

    def _violation(self, module: Module, node: ast.AST, reason: str) -> None:
        self.violations.append(f"{module.where(node)}: {reason}")


@dataclass(frozen=True)
class _Holder:
    """Parameter `param` of `function` holds a query helper taking its query at `query_at`."""

    module: Module
    function: ast.FunctionDef | ast.AsyncFunctionDef
    param: str
    query_at: int
    query_param: str
    helper: str

    def uses(self) -> Iterator[ast.expr | tuple[ast.AST, str]]:
        """The query argument of every call of the helper through this parameter (or the
        attribute it is stored in), or (node, reason) for a use that cannot be followed."""
        for node in ast.walk(self.function):
            if not (isinstance(node, ast.Name) and node.id == self.param):
                continue
            if isinstance(node.ctx, ast.Store):
                yield node, f"{self.param} (holding {self.helper}) is reassigned"
                continue
            parent = self.module.parents.get(node)
            if isinstance(parent, ast.Call) and parent.func is node:
                yield self._query_of(parent)
            elif (
                isinstance(parent, ast.Assign)
                and parent.value is node
                and len(parent.targets) == 1
                and isinstance(parent.targets[0], ast.Attribute)
                and isinstance(parent.targets[0].value, ast.Name)
                and parent.targets[0].value.id == "self"
            ):
                yield from self._attribute_uses(parent.targets[0].attr)
            else:
                yield node, f"{self.param} (holding {self.helper}) is passed on"

    def _attribute_uses(self, attr: str) -> Iterator[ast.expr | tuple[ast.AST, str]]:
        enclosing = self.module.enclosing(self.function)
        cls = next((s for s in enclosing if isinstance(s, ast.ClassDef)), None)
        if cls is None:
            yield self.function, f"self.{attr} is not an instance attribute here"
            return
        for node in ast.walk(cls):
            if not (
                isinstance(node, ast.Attribute)
                and node.attr == attr
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and isinstance(node.ctx, ast.Load)
            ):
                continue
            parent = self.module.parents.get(node)
            if isinstance(parent, ast.Call) and parent.func is node:
                yield self._query_of(parent)
            else:
                yield node, f"self.{attr} (holding {self.helper}) is passed on"

    def _query_of(self, call: ast.Call) -> ast.expr | tuple[ast.AST, str]:
        argument = _argument_for(call, _callee_name(call), self.query_param, self.query_at, False)
        if isinstance(argument, ast.expr):
            return argument
        return call, f"cannot see which query is passed to {self.helper}"


def _local_name(module: Module, node: ast.AST) -> bool:
    """Whether `node` is a bare name bound inside its function (a parameter or a local that
    happens to share a helper's name), so not a reference to that helper."""
    if not isinstance(node, ast.Name):
        return False
    for scope in module.enclosing(node):
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef) and (
            node.id in {a.arg for a in _all_args(scope)} or any(_bindings(scope, node.id))
        ):
            return True
    return False


def _callee_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


# --- AST helpers -----------------------------------------------------------------------------------

_NOT_THIS_FUNCTION = object()


def _calls(tree: ast.AST) -> Iterator[ast.Call]:
    return (n for n in ast.walk(tree) if isinstance(n, ast.Call))


def _looks_like_session(receiver: ast.expr) -> bool:
    text = ast.unparse(receiver).lower()
    return any(word in text for word in ("session", "tx", "transaction", "driver"))


def _all_args(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = function.args
    extra = [x for x in (a.vararg, a.kwarg) if x is not None]
    return [*a.posonlyargs, *a.args, *a.kwonlyargs, *extra]


def _bindings(scope: ast.AST, name: str) -> Iterator[ast.expr | Tainted]:
    """What `name` is bound to directly in `scope` (not in nested functions or classes)."""
    for node in _own_nodes(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                yield from _bound_by(target, name, node.value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            yield from _bound_by(node.target, name, node.value)
        elif isinstance(node, ast.AugAssign) and _names_in_target(node.target) == {name}:
            yield node.value
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            if name in _names_in_target(node.target):
                yield node.iter  # each item of a constant collection is constant
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                if item.optional_vars is not None and name in _names_in_target(item.optional_vars):
                    yield Tainted(f"{name!r} is bound by a with statement")
        elif isinstance(node, ast.NamedExpr) and node.target.id == name:
            yield node.value
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                yield Tainted(f"{name!r} is a function or class")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            continue  # resolved separately
        elif isinstance(node, ast.ExceptHandler) and node.name == name:
            yield Tainted(f"{name!r} is an exception")


def _bound_by(target: ast.expr, name: str, value: ast.expr) -> Iterator[ast.expr | Tainted]:
    if isinstance(target, ast.Name) and target.id == name:
        yield value
    elif isinstance(target, ast.Tuple | ast.List) and name in _names_in_target(target):
        if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(target.elts):
            for sub_target, sub_value in zip(target.elts, value.elts, strict=True):
                yield from _bound_by(sub_target, name, sub_value)
        else:
            yield Tainted(f"{name!r} is unpacked from {ast.unparse(value)}")


def _names_in_target(target: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """Nodes of `scope` outside its nested functions and classes (their definitions included)."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))


def _assigned_on_instances(cls: ast.ClassDef, attr: str) -> bool:
    return any(
        isinstance(n, ast.Attribute)
        and n.attr == attr
        and isinstance(n.ctx, ast.Store)
        and isinstance(n.value, ast.Name)
        and n.value.id in {"self", "cls"}
        for n in ast.walk(cls)
    )


def _name_in(module: Module, name: str) -> ast.Name | None:
    """A Name node standing for `name` at the top level of `module`, to resolve it there."""
    for node in module.tree.body:
        for target in _module_targets(node):
            if target.id == name:
                return target
    return None


def _module_targets(node: ast.stmt) -> Iterator[ast.Name]:
    if isinstance(node, ast.Assign):
        for target in node.targets:
            yield from (n for n in ast.walk(target) if isinstance(n, ast.Name))
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        yield node.target


def _refers_to(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load)) or (
        isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.ctx, ast.Load)
    )


def _is_called_or_run(module: Module, node: ast.AST) -> bool:
    """Whether this reference to a helper is a call of it, or hands it to a transaction runner
    (those uses are followed; any other use hides where its query comes from)."""
    parent = module.parents.get(node)
    if isinstance(parent, ast.Call) and parent.func is node:
        return True
    return (
        isinstance(parent, ast.Call)
        and isinstance(parent.func, ast.Attribute)
        and parent.func.attr in TRANSACTION_RUNNERS
        and bool(parent.args)
        and parent.args[0] is node
    )


def _argument_for(
    call: ast.Call, function: str, param: str, index: int, is_method: bool
) -> ast.expr | object | None:
    """The expression `call` passes as `param` of `function`; `_NOT_THIS_FUNCTION` when `call`
    is not a call of it; None when it cannot be seen (`*args`, `**kwargs`)."""
    func = call.func
    callee = (
        func.id
        if isinstance(func, ast.Name)
        else func.attr
        if isinstance(func, ast.Attribute)
        else None
    )
    if callee == function:
        position = index - 1 if is_method and isinstance(func, ast.Attribute) else index
        args = call.args
    elif callee in TRANSACTION_RUNNERS and call.args and _refers_to(call.args[0], function):
        # session.execute_read(work, a, b) calls work(tx, a, b): the work's parameter `index`
        # (counting tx, and self for a bound method) is the runner's argument `index`.
        position = index - 1 if is_method else index
        args = call.args
    else:
        return _NOT_THIS_FUNCTION
    for keyword in call.keywords:
        if keyword.arg == param:
            return keyword.value
    if any(isinstance(a, ast.Starred) for a in args[: position + 1]):
        return None
    if 0 <= position < len(args):
        return args[position]
    return None


# --- the code base ---------------------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    inside = parts[parts.index("src") + 1 :]
    return ".".join(p for p in inside if p != "__init__")


def code_base() -> list[Module]:
    paths = sorted({p for pattern in SOURCE_GLOBS for p in ROOT.glob(pattern)})
    return [Module.load(p, _module_name(p)) for p in paths]


def check_sources(sources: dict[str, str]) -> list[str]:
    """Violations of the modules given as text (for the checker's own tests)."""
    modules = [Module.load(ROOT / f"{name}.py", name, text) for name, text in sources.items()]
    return CypherChecker(modules).check()


def test_every_cypher_query_of_the_code_base_is_a_constant() -> None:
    checker = CypherChecker(code_base())
    violations = checker.check()
    assert violations == [], "Cypher built from something not constant:\n" + "\n".join(violations)
    # The scan did find the code base's queries (a broken scan would pass vacuously).
    assert checker.checked_calls >= 15


# --- the checker catches what it must ------------------------------------------------------------

GOOD = """
import neo4j

_LABEL = "Tool"
_BY_ID = f"MATCH (n:{_LABEL} {{tenant_id: $tenant, id: $id}}) RETURN n"
_SCHEMA = ("CREATE INDEX a IF NOT EXISTS FOR (n:Tool) ON (n.id)", "CREATE INDEX b ...")
_BY_KIND = {"tool": "MATCH (n:Tool) RETURN n", "capability": "MATCH (n:Capability) RETURN n"}
_TYPES = frozenset({"CAUSES", "REQUIRES"})


class Finder:
    def __init__(self, read):
        self._reader = read

    async def find(self, tenant):
        return await self._reader(_BY_ID, tenant=tenant)

_WRITE = {t: "MERGE (a)-[:%s]->(b)" % t for t in sorted(_TYPES)}


async def _run(tx, query, **params):
    await tx.run(query, params)


async def _fetch(tx, query, params):
    return [r async for r in await tx.run(query, params)]


class Store:
    QUERY = "MATCH (n) RETURN count(n)"

    async def _read(self, cypher, **params):
        async def work(tx):
            return await tx.run(cypher, params)
        async with self._driver.session() as session:
            return await session.execute_read(work)

    async def get(self, tenant, node_id, kind):
        await self._read(_BY_ID, tenant=tenant, id=node_id)
        await self._read(_BY_KIND[kind])
        await self._read(self.QUERY)
        async with self._driver.session() as session:
            await session.execute_read(_fetch, _BY_ID, {"tenant": tenant})
            for statement in _SCHEMA:
                await session.run(statement)
            await session.run(neo4j.Query(_BY_ID, timeout=5.0), tenant=tenant)

    async def reads(self, tenant):
        finder = Finder(self._read)
        await finder.find(tenant)

    async def write(self, tx, tenant, relation):
        await _run(tx, "MATCH (n {tenant_id: $tenant}) DETACH DELETE n", tenant=tenant)
        await _run(tx, _WRITE[relation.type], tenant=tenant)
"""


def test_the_checker_accepts_constants_through_helpers() -> None:
    assert check_sources({"good": GOOD}) == []


def test_the_checker_rejects_a_query_built_from_a_parameter() -> None:
    bad = (
        GOOD
        + """
async def find(session, label, node_id):
    await session.run(f"MATCH (n:{label}) WHERE n.id = '" + node_id + "' RETURN n")
"""
    )
    violations = check_sources({"bad": bad})
    assert len(violations) == 1
    assert "spliced into the query text" in violations[0]


def test_the_checker_follows_helpers_to_a_caller_passing_input() -> None:
    bad = (
        GOOD
        + """
class Handler:
    async def on_request(self, store, request):
        await store._read(request.query)
        await _run(self.tx, "MATCH (n {id: '%s'})" % request.id)
"""
    )
    violations = check_sources({"bad": bad})
    assert len(violations) == 2, violations
    assert any("request.query" in v for v in violations)
    assert any("request.id" in v for v in violations)


def test_the_checker_rejects_queries_from_variables_it_cannot_prove() -> None:
    bad = (
        GOOD
        + """
async def load(driver, path, tenant):
    query = open(path).read()
    await driver.execute_query(query, tenant=tenant)
    text = _LABEL
    text += tenant
    await driver.execute_query(text)
    await driver.execute_query(query_=_BY_KIND.get(tenant))


def hand_out():
    return _run
"""
    )
    violations = check_sources({"bad": bad})
    reasons = "\n".join(violations)
    assert "open(path).read" in reasons or "calling open" in reasons, reasons
    assert "'tenant' of load" in reasons or "parameter 'tenant'" in reasons, reasons
    assert "passed around as a value" in reasons, reasons
    assert len(violations) == 4, reasons


def test_the_checker_follows_a_helper_handed_to_a_class() -> None:
    bad = (
        GOOD
        + """
class Leaky:
    def __init__(self, read, other):
        self._run_query = read
        other(read)

    async def find(self, request):
        return await self._run_query(request.cypher)


async def build(store):
    return Leaky(store._read, print)
"""
    )
    violations = check_sources({"bad": bad})
    reasons = "\n".join(violations)
    assert "request.cypher" in reasons, reasons
    assert "is passed on" in reasons, reasons
    assert len(violations) == 2, reasons


def test_the_checker_rejects_labels_taken_from_input() -> None:
    bad = (
        GOOD
        + """
async def relate(tx, relation):
    labels = [f"MERGE (a)-[:{t}]->(b)" for t in relation.types]
    await tx.run(labels[0])
"""
    )
    violations = check_sources({"bad": bad})
    assert len(violations) == 1
    assert "relation.types" in violations[0]


def test_the_checker_follows_public_helpers_across_modules() -> None:
    helper = """
import neo4j

async def read(driver, query):
    return await driver.execute_query(query)
"""
    caller = """
from helper import read

async def handle(driver, request):
    await read(driver, "MATCH (n) RETURN n")
    await read(driver, request.text)
"""
    violations = check_sources({"helper": helper, "caller": caller})
    assert len(violations) == 1
    assert "caller.py" in violations[0] and "request.text" in violations[0]


def test_every_cypher_call_of_the_code_base_fails_the_check_once_fed_input() -> None:
    """Mutation check on the real sources: splicing input into any one query is caught."""
    modules = code_base()
    mutated_calls = 0
    for index, module in enumerate(modules):
        checker = CypherChecker(modules)
        calls = [
            c for c in _calls(module.tree) if isinstance(checker._sink_query(module, c), ast.expr)
        ]
        lines = module.path.read_text().splitlines(keepends=True)
        for call in calls:
            query = checker._sink_query(module, call)
            assert isinstance(query, ast.expr) and query.end_col_offset is not None
            line = query.lineno - 1
            if query.end_lineno != query.lineno:
                continue  # a multi-line literal: its neighbours cover the same helper
            # Offsets count UTF-8 bytes.
            raw = lines[line].encode()
            argument = raw[query.col_offset : query.end_col_offset].decode()
            spliced = (
                raw[: query.col_offset].decode()
                + f"({argument} + input())"
                + raw[query.end_col_offset :].decode()
            )
            source = "".join([*lines[:line], spliced, *lines[line + 1 :]])
            with_input = [
                *modules[:index],
                Module.load(module.path, module.name, source),
                *modules[index + 1 :],
            ]
            violations = CypherChecker(with_input).check()
            where = f"{module.path.relative_to(ROOT)}:"
            assert any(v.startswith(where) for v in violations), (where, query.lineno)
            mutated_calls += 1
    assert mutated_calls >= 15
