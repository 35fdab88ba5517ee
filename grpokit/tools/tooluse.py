"""Multi-turn tool use (recipe section `tools`): the user's environment class and tool functions, resolved and checked
before any weights load, handed to TRL, and explained.

TRL 1.16 runs the rollouts inside `GRPOTrainer`: `tools=[functions]`, `environment_factory=` (a class whose
`reset(**row)` starts a rollout, returning None or text added to the prompt, and whose public methods are tools;
`get_reward()`, when defined, is one more reward) and `trainer.max_tool_calling_iterations`. A rollout: the model
writes; each tool call in its text is parsed by the tokenizer's response parser, run, and its result appended as a
`tool` message; the model writes on, up to `max_tool_calling_iterations` rounds. The loss sees every turn as one
completion, with the tool results' tokens masked out (TRL's `tool_mask`): the model is trained on what it wrote, never
on what a tool returned. `max_completion_length` bounds the whole exchange, tool results included.

Loading follows a user reward's rules (`rewards._machinery.user`): `path/to/file.py:Name` (relative to the recipe) or
`package.module:Name`, never the standard library, and nothing is called at `--check`: an environment's constructor
runs only when training builds one instance per rollout.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass, field
from typing import Callable

from grpokit.tools.environments import PYTHON_LIMITS, PythonTool
from grpokit.errors import Problem, Problems, nearest
from grpokit.fields import Field
from grpokit.tools.templates import parsed_by_trl, template_names, template_text  # noqa: F401 - the template names' home

# Class members TRL does not expose as tools (`GRPOTrainer.__init__` lists them on the class): `reset` starts a
# rollout, `get_reward` scores it, and a name starting with `_` is private.
NOT_TOOLS = ("reset", "get_reward")

# The section's keys (`tools`): TRL's multi-turn tool use. Names follow a user reward's rules: path/to/file.py:Name
# (relative to the recipe) or package.module:Name; trainer.max_tool_calling_iterations bounds the rounds.
TOOLS = {
    "environment": Field(str | None, None, "a class with reset(**row) whose public methods are tools, one instance per "
                         "rollout (TRL's environment_factory); get_reward(), if defined, is one more reward"),
    "environment_args": Field(dict, {}, "keyword arguments for the environment's constructor"),
    "functions": Field(list[str], [], "tool functions: typed arguments and a docstring describing each (TRL's tools)"),
    # Each call is bounded (grpokit/tools/toolguard.py): past either limit it fails with an error naming it, which the model
    # reads as the result and the report counts as a failed call; the run goes on. The defaults fit a normal call: a
    # computation or a local lookup returns in milliseconds, a network call in seconds; 10,000 characters (~2,500
    # tokens) already fill most completion budgets. The ceiling on results: TRL tokenizes a result before it can see
    # that it does not fit, and a 10 MB one made the tokenizer abort the process allocating 1.7 GB.
    "timeout_seconds": Field(float, 10.0, "seconds one tool call may take", gt=0, max=3600),
    "max_result_chars": Field(int, 10_000, "characters of one tool result (its text); a longer one is dropped",
                              min=1, max=1_000_000),
}


def _kinds():
    from rewards._machinery.user import Kind

    environment = Kind("environment", "a class with a `reset` method, defined in that file or module", "Class",
                       functions=False, marked_classes=False)
    tool = Kind("tool", "a function with typed arguments and a docstring describing each, defined in that file or module",
                "function", classes=False)
    return environment, tool


@dataclass
class Toolset:
    """What a recipe's `tools` section resolves to: what TRL's `GRPOTrainer` takes, and what `--check` explains."""

    environment: type | None = None
    environment_args: dict = field(default_factory=dict)
    functions: list[Callable] = field(default_factory=list)
    timeout_seconds: float = TOOLS["timeout_seconds"].default  # the section's limits on each call (grpokit.tools.toolguard)
    max_result_chars: int = TOOLS["max_result_chars"].default

    def methods(self) -> list[str]:
        """The environment's tool methods, as TRL finds them: public functions on the class but reset and get_reward."""
        if self.environment is None:
            return []
        return [n for n, _ in inspect.getmembers(self.environment, predicate=inspect.isfunction)
                if not n.startswith("_") and n not in NOT_TOOLS]

    def tool_names(self) -> list[str]:
        return [f.__name__ for f in self.functions] + self.methods()

    @property
    def owns_reward(self) -> bool:
        return self.environment is not None and callable(getattr(self.environment, "get_reward", None))

    def trainer_kwargs(self, tally=None) -> dict:
        """`tools=` and `environment_factory=` for `GRPOTrainer`: one environment instance per rollout, built with the
        recipe's `environment_args`; every call bounded and every fault of the environment blamed (grpokit.tools.toolguard).
        The calls each limit cut are counted in `tally` (a `toolguard.Tally`), when given."""
        from grpokit.tools import envguard, toolguard

        limits = toolguard.Limits(self.timeout_seconds, self.max_result_chars, tally or toolguard.Tally())
        kwargs: dict = {}
        if self.functions:
            kwargs["tools"] = [toolguard.bounded_function(f, limits) for f in self.functions]
        if self.environment is not None:
            kwargs["environment_factory"] = envguard.environment_factory(self.environment, dict(self.environment_args),
                                                                          limits, self.methods())
        return kwargs


def resolve(section: dict) -> Toolset:
    """The classes and functions a validated `tools` section names (`check` has refused every other)."""
    from rewards._machinery.user import load_user_target

    environment_kind, tool_kind = _kinds()
    env = section.get("environment")
    return Toolset(load_user_target(env, environment_kind) if env else None, dict(section.get("environment_args") or {}),
                   [load_user_target(name, tool_kind) for name in section.get("functions") or []],
                   **_limits(section))


def _limits(section: dict) -> dict:
    """The section's limits on each call that it sets (the rest keep Toolset's defaults)."""
    return {k: section[k] for k in ("timeout_seconds", "max_result_chars") if section.get(k) is not None}


def check(section: dict, problems: Problems, where_set, few_shot=None) -> Toolset | None:
    """Every problem of a `tools` section at once: what it names loads and is what TRL needs, each tool's schema can
    be built, no two tools share a name, the constructor takes `environment_args`, and the worked calls of
    `dataset.few_shot` call tools that exist (grpokit.tools.toolchecks). Nothing the section names is called."""
    from rewards import RewardNameError

    from grpokit.tools import toolchecks
    from rewards._machinery.user import load_user_target

    environment_kind, tool_kind = _kinds()
    toolset, before = Toolset(environment_args=dict(section.get("environment_args") or {}),
                              **_limits(section)), len(problems.items)
    if section.get("environment"):
        try:
            toolset.environment = load_user_target(section["environment"], environment_kind)
        except RewardNameError as err:
            problems.add("tools.environment", str(err), file=where_set("tools.environment"))
    for i, name in enumerate(section.get("functions") or []):
        try:
            toolset.functions.append(load_user_target(name, tool_kind))
        except RewardNameError as err:
            problems.add(f"tools.functions[{i}]", str(err), file=where_set("tools.functions"))
    if toolset.environment is not None:
        problems.extend(_environment_problems(toolset, where_set))
    elif toolset.environment_args and not section.get("environment"):
        problems.add("tools.environment_args", "are the environment's constructor arguments, and tools.environment is not set",
                     toolset.environment_args, file=where_set("tools.environment_args"))
    for i, fn in enumerate(toolset.functions):
        problems.extend(_schema_problems(fn, fn.__name__, f"tools.functions[{i}]", where_set("tools.functions")))
    if len(problems.items) == before:  # every name loaded: the names can be compared
        problems.extend(toolchecks.duplicate_problems(toolset.functions, toolset.environment, toolset.methods(),
                                                      where_set("tools.functions")))
        problems.extend(toolchecks.few_shot_problems(few_shot, toolset.tool_names(), where_set("dataset.few_shot")))
        callables = {f.__name__: f for f in toolset.functions}
        callables.update({m: getattr(toolset.environment, m) for m in toolset.methods()})
        problems.extend(toolchecks.call_argument_problems(few_shot, callables, where_set("dataset.few_shot")))
    if len(problems.items) == before and not toolset.tool_names():
        problems.add("tools", "names no tool: give tools.functions, or an environment with a public method (TRL exposes "
                     "each public method as a tool)", file=where_set("tools"))
    return toolset if len(problems.items) == before else None


def _environment_problems(toolset: Toolset, where_set) -> list[Problem]:
    from grpokit.tools import toolchecks

    env, where = toolset.environment, where_set("tools.environment")
    found = []
    reset = inspect.getattr_static(env, "reset", None)
    if not inspect.isfunction(reset):
        found.append(Problem("tools.environment", f"{env.__name__} has no `reset` method: TRL calls reset(**row) with the "
                             "dataset row to start each rollout (return None, or text to add to the prompt)", file=where))
    get_reward = inspect.getattr_static(env, "get_reward", None)
    if get_reward is not None and _required_arguments(get_reward):
        found.append(Problem("tools.environment", f"{env.__name__}.get_reward takes argument(s) "
                             f"{', '.join(_required_arguments(get_reward))}: TRL calls get_reward() with none, once per "
                             "finished rollout", file=where))
    try:
        signature = inspect.signature(env)
    except ValueError:  # a signature Python cannot read (a C type): TRL would still call it; nothing to check
        signature = None
    if signature is not None:
        # Every key at once: each one the constructor does not take, then the values of those it does (their
        # annotations, and the shipped Python tool's bounds), never one problem hiding another.
        params = list(signature.parameters)
        takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
        known = {k: v for k, v in toolset.environment_args.items() if k in params or takes_any}
        for key in toolset.environment_args:
            if key not in known:
                found.append(Problem(f"tools.environment_args.{key}", f"is not an argument of {env.__name__}'s "
                                     "constructor", toolset.environment_args[key], allowed=", ".join(params) or "none",
                                     suggestion=nearest(key, params), file=where_set("tools.environment_args")))
        try:
            signature.bind(**known)
        except TypeError as err:  # one it needs left out
            found.append(Problem("tools.environment_args", f"do not fit {env.__name__}'s constructor: {err}",
                                 toolset.environment_args, allowed=", ".join(params) or "none",
                                 file=where_set("tools.environment_args")))
        typed = toolchecks.argument_problems(env, known, where_set("tools.environment_args"))
        mistyped = {p.path.rpartition(".")[2] for p in typed}
        found.extend(typed + toolchecks.python_tool_problems(
            env, {k: v for k, v in known.items() if k not in mistyped},
            {"timeout_seconds": toolset.timeout_seconds, "max_result_chars": toolset.max_result_chars},
            where_set("tools.environment_args")))
    for name in toolset.methods():
        method = tool_view(env, name)
        found.extend(_schema_problems(method, f"{env.__name__}.{name}", "tools.environment", where))
    return found


def tool_view(env: type, name: str):
    """An environment method as the model sees it, without building the environment: bound to a stand-in, so `self`
    leaves the schema (a staticmethod has none to leave)."""
    raw = inspect.getattr_static(env, name)
    return raw.__func__ if isinstance(raw, staticmethod) else types.MethodType(raw, object())


def _required_arguments(function) -> list[str]:
    params = list(inspect.signature(function).parameters.values())[1:]  # past self
    return [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _schema_problems(function, shown: str, key: str, where: str) -> list[Problem]:
    """What transformers' `get_json_schema` (the schema the chat template renders for the model) refuses in a tool."""
    from transformers.utils import get_json_schema
    from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

    try:
        get_json_schema(function)
    except (DocstringParsingException, TypeHintParsingException) as err:
        return [Problem(key, f"tool {shown}: {err}; a tool needs a type hint on every argument and a Google-style "
                        "docstring: a description, then `Args:` with a line per argument", file=where)]
    except Exception as err:  # noqa: BLE001 - any other refusal is said with the tool's name
        return [Problem(key, f"tool {shown}: its schema cannot be built ({type(err).__name__}: {err})", file=where)]
    return []


def row_problems(toolset: Toolset, columns: list[str], file: str | None) -> list[Problem]:
    """TRL calls the environment's `reset(**row)` with every column of the prepared dataset: its signature must take
    them."""
    if toolset.environment is None or not inspect.isfunction(inspect.getattr_static(toolset.environment, "reset", None)):
        return []
    reset = inspect.getattr_static(toolset.environment, "reset")
    try:
        inspect.signature(reset).bind(None, **{c: None for c in columns})
    except TypeError as err:
        return [Problem("tools.environment", f"{toolset.environment.__name__}.reset cannot take the dataset's row ({err}): "
                        f"TRL calls reset(**row) with every column ({', '.join(columns)}); add **kwargs to take those it "
                        "does not read", file=file)]
    return []


# ----------------------------------------------------------------------------------------------------
# The chat template: it must render a tool call and its result, and TRL must parse the model's calls from it


_PLAIN = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]


def same_format(tokenizer) -> list[str]:
    """TRL's templates that TRL can parse tool calls from and that render a plain conversation exactly as this
    tokenizer's own template does: the ones a user can set without changing what the model reads."""
    try:
        own = tokenizer.apply_chat_template(_PLAIN, tokenize=False)
    except Exception:  # noqa: BLE001 - no usable template of its own: nothing to match
        return []
    found = []
    for name in template_names():
        try:
            if parsed_by_trl(name) and tokenizer.apply_chat_template(_PLAIN, tokenize=False, chat_template=template_text(name)) == own:
                found.append(name)
        except Exception:  # noqa: BLE001 - a template that cannot render this plain exchange matches nothing
            continue
    return found


def template_problems(tokenizer, model: dict, file: str | None) -> list[Problem]:
    """The tokenizer's chat template (after `model.chat_template`) is one TRL's tool loop can run on: it renders tool
    calls and their results, TRL parses the model's calls from it, and it is prefix-preserving or TRL has a training
    variant of it (grpokit.tools.templates); else one problem naming the template and TRL's templates that would do, and
    which of them fits this model."""
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    from grpokit.tools import templates

    set_name = model.get("chat_template")
    where, value = ("model.chat_template", set_name) if set_name else ("model.name_or_path", model.get("name_or_path"))
    fits = same_format(tokenizer) if not set_name else []
    fix = (f"; TRL's templates that read like this model's own and whose calls TRL parses: {', '.join(fits)}: set "
           f"model.chat_template: {fits[0]}" if fits else "; set model.chat_template to one of TRL's templates written "
           "in this model's format (its role markers), e.g. qwen2_5 or qwen3 for ChatML models (Qwen2.5, SmolLM2, "
           "SmolLM3)")
    template = templates.shown(model)

    def problem(what: str) -> list[Problem]:
        return [Problem(where, f"{template}: {what}{fix}", value, allowed="TRL's templates whose tool calls it parses: "
                        + ", ".join(templates.tool_templates(tokenizer)), file=file)]

    if not supports_tool_calling(tokenizer):
        return problem("cannot render a tool call and its result (TRL's supports_tool_calling)")
    has_parser = getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None) is not None
    if not has_parser:
        try:
            add_response_schema(tokenizer)
        except ValueError:
            return problem("TRL cannot parse tool calls written in it (no response parser for this template)")
    keeps, variant = templates.training_variant(tokenizer)
    if not keeps and variant is None:
        return problem("is not prefix-preserving (an earlier turn renders otherwise once a tool's result follows), which "
                       "TRL's tool loop needs, and TRL has no training variant of it: GRPOTrainer would refuse it")
    return []


# ----------------------------------------------------------------------------------------------------
# --check's account of a rollout


def explain(toolset: Toolset, recipe, args, tokenizer=None) -> list[str]:
    """What one rollout is under this recipe: its chat template (with the `tokenizer`, when given: grpokit.tools.templates),
    its turns, which tokens are trained on and which are masked, what bounds it, and where its reward comes from."""
    iterations = args.max_tool_calling_iterations
    rounds = f"at most {iterations} round(s) (trainer.max_tool_calling_iterations)" if iterations else \
        "no bound on rounds (trainer.max_tool_calling_iterations unset): only the length stops it"
    from grpokit.tools import toolchecks

    lines = ["# tool use: how a rollout goes (TRL's multi-turn loop, inside GRPOTrainer)"]
    if toolset.environment is not None:
        env = toolset.environment.__name__
        args_shown = ", ".join(f"{k}={v!r}" for k, v in toolset.environment_args.items())
        lines.append(f"  environment   {env}({args_shown}), one instance per rollout; {env}.reset(**row) starts it with the "
                     "dataset row (text it returns is added to the prompt)")
    for fn in toolset.functions:
        lines.append(f"  tool          {fn.__name__}{_shown_signature(fn, method=False)} (function); "
                     f"{toolchecks.what_the_model_reads(fn)}")
    for name in toolset.methods():
        view = tool_view(toolset.environment, name)
        lines.append(f"  tool          {toolset.environment.__name__}.{name}{_shown_signature(view, method=False)} "
                     f"(environment method); {toolchecks.what_the_model_reads(view)}")
    if tokenizer is not None:
        from grpokit.tools import templates

        lines += templates.explain(tokenizer, recipe.model, args.chat_template_kwargs)
    else:  # the model's own template, and its tokenizer not here: the run checks it as it loads, before any weights
        lines.append(f"  template      the model's own ({recipe.model.get('name_or_path')}): its tokenizer is not here, "
                     "so whether TRL parses its tool calls is checked when the run loads it; name one of TRL's "
                     "templates (model.chat_template) to have it checked now")
    lines += [f"  limits        each call: tools.timeout_seconds {toolset.timeout_seconds:g} s, tools.max_result_chars "
              f"{toolset.max_result_chars} characters; past either the call fails with an error naming the limit (the "
              "model reads it as the result; a failed call in the report) and the run goes on",
              "  runs as       " + _runs_as(toolset)]
    template = recipe.model.get("chat_template") or "the model's own"
    lines += [f"  turns         {rounds}: the model writes; each tool call in its text is parsed ({template} chat "
              "template's parser), run, and its result appended as a `tool` message; the model writes on",
              "  generation    " + ("a turn after a tool's result starts from the keys and values the turn before "
                                   "computed, each prompt computed once for its copies, where grpokit's own passes run "
                                   "(the table's `own passes` row says whether, for this model; sampling.reuse_prefix)"
                                   if recipe.sampling.get("reuse_prefix", True) else
                                   "every turn computes the whole exchange again (sampling.reuse_prefix: false)")
              + "; a turn decodes no further than the completion's room (grpokit/trainer/generation.py)",
              "  trained on    every token the model wrote, in every turn; a tool result's tokens are in the completion but "
              "masked out of the loss (TRL's tool_mask): the model is never trained to write what a tool returned",
              f"  length        max_completion_length {args.max_completion_length} tokens bounds the whole exchange, tool "
              "results included: a result that would pass it is dropped and the rollout ends",
              "  reward        " + _reward_source(toolset, recipe),
              "  logged        tools/call_frequency (calls per completion) and tools/failure_frequency (failed calls per "
              "call), in report.md's Tool use part and the plots; tools/timeout_frequency and tools/oversize_frequency "
              "(calls each limit cut, per call), tools/bad_arguments_frequency (calls naming arguments the tool does "
              "not take, refused before they run, per call)"]
    return lines


def _runs_as(toolset: Toolset) -> str:
    yours = ("you, not in a sandbox: your environment and tools run inside the training process with your permissions "
             "(your files, the network, the process's memory); give a tool only what the task needs: the model picks "
             "every argument, and a policy under RL tries whatever raises its reward")
    env = toolset.environment
    if not (inspect.isclass(env) and issubclass(env, PythonTool)):
        return yours
    caged = (f"the model's code, caged (no network, none of your files): each call within "
             f"{_arg(toolset, 'timeout_seconds')} s, {_arg(toolset, 'memory_mb')} MB of memory, "
             f"{_arg(toolset, 'processes')} processes, {_arg(toolset, 'max_output_chars')} output characters; "
             "each rollout's calls run in one worker process of grpokit's untrusted-work pool (a read-only root of "
             "Python and its libraries, a /tmp of its own; an unprivileged user, seccomp) that keeps the names earlier "
             "calls defined and ends at the next reset; a call past its time or killing its interpreter fails, and the "
             "next starts a fresh one")
    return caged if not toolset.functions else f"{caged}; tools.functions: {yours}"


def _arg(toolset: Toolset, key: str):
    return toolset.environment_args.get(key, PYTHON_LIMITS[key][0])


def _shown_signature(function, method: bool = True) -> str:
    """`(a: int, b: int) -> int`: annotations as types even under `from __future__ import annotations`, no `self`."""
    try:
        signature = inspect.signature(function, eval_str=True)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve is shown as written
        signature = inspect.signature(function)
    params = list(signature.parameters.values())[1 if method else 0:]
    return str(signature.replace(parameters=params))


def _reward_source(toolset: Toolset, recipe) -> str:
    parts = [f"{r['name']} (x{r['weight']:g})" for r in recipe.rewards]
    if toolset.owns_reward:
        parts.append(f"{toolset.environment.__name__}.get_reward() (x1, TRL's weight for it), once per finished rollout")
    return (" + ".join(parts) + "; a reward reading the completion's text reads the model's last turn, never a "
            "tool's result (rewards.text)")


# ----------------------------------------------------------------------------------------------------
# Token costs, measured with the chat template: what the memory plan and the lint add for tool use


def template_tools(toolset: Toolset) -> list:
    """The tools as the template renders them: functions, and the environment's methods bound to a stand-in (the
    schema reads only the signature and docstring; no environment is built)."""
    env = toolset.environment
    return list(toolset.functions) + [tool_view(env, n) for n in toolset.methods()]


def _length(tokenizer, messages, **kwargs) -> int:
    return len(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, add_generation_prompt=True, **kwargs))


def schema_tokens(tokenizer, toolset: Toolset) -> int:
    """Tokens the tools' schemas add to every prompt (TRL renders each prompt with `tools=`)."""
    user = [{"role": "user", "content": "x"}]
    return _length(tokenizer, user, tools=template_tools(toolset)) - _length(tokenizer, user)


def round_tokens(tokenizer, toolset: Toolset) -> int:
    """Tokens one round of tool use costs before any output: a call with no arguments, its empty result, and the
    prompt for the model's next turn, as this chat template wraps them."""
    name = toolset.tool_names()[0]
    user = [{"role": "user", "content": "x"}]
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": name, "arguments": {}}}]}
    return _length(tokenizer, user + [call, {"role": "tool", "name": name, "content": ""}]) - _length(tokenizer, user)
