"""The chat template as TRL's tool loop reads it: which one a run uses, whether TRL parses the model's tool calls from
it, whether it is prefix-preserving (or which of TRL's training templates TRL swaps in), and whether it thinks.

TRL 1.16's `GRPOTrainer.__init__`, with tools: `supports_tool_calling` (the template renders a call and its result)
or a ValueError; `add_response_schema` (a parser for the model's calls, known for TRL's own templates only) unless
the tokenizer has one; and, when `is_chat_template_prefix_preserving` is false (an earlier turn renders otherwise
once a tool's result follows, so the tokens the loop appends would not be the template's), `get_training_chat_template`
-- TRL's training variant of that template, or a ValueError when it has none. Each of these is asked here, of TRL's
own functions, before any weights load.
"""

from __future__ import annotations

import types


def template_names() -> list[str]:
    """TRL's shipped chat templates (`trl.chat_template_utils.<name>_chat_template`), the names `model.chat_template`
    takes."""
    import trl.chat_template_utils as utils

    return sorted(n[: -len("_chat_template")] for n in vars(utils)
                  if n.endswith("_chat_template") and not n.endswith("_training_chat_template")
                  and isinstance(getattr(utils, n), str))


def template_text(name: str) -> str:
    import trl.chat_template_utils as utils

    return getattr(utils, f"{name}_chat_template")


def parsed_by_trl(name: str) -> bool:
    """Whether TRL can parse tool calls written in its template `name` (`add_response_schema` knows it)."""
    return _parses(template_text(name))


def _parses(text: str) -> bool:
    from trl.chat_template_utils import add_response_schema

    try:
        add_response_schema(types.SimpleNamespace(chat_template=text))
    except ValueError:
        return False
    return True


def shown(model: dict) -> str:
    """The template a run uses, as --check and errors name it."""
    name = model.get("chat_template")
    if name:
        return f"{name} (TRL's, model.chat_template)"
    return f"the model's own ({model.get('name_or_path')})"


def stand_in(model: dict):
    """A tokenizer to read the TRL template `model.chat_template` names with, where the model's own tokenizer is not
    reachable (--check of a hub model never downloads): grpokit's tiny character tokenizer carrying that template.
    TRL's checks render conversations and compare the renderings (text, or its tokens: one per character here), so
    what they say of the template does not depend on the model's vocabulary. None when no TRL template is named:
    a model's own template is read from its own tokenizer or not at all.

    >>> stand_in({"chat_template": "qwen3"}).chat_template == template_text("qwen3")
    True
    """
    name = model.get("chat_template")
    if not name:
        return None
    from grpokit.checkpoints.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.chat_template = template_text(name)
    return tokenizer


def _as(tokenizer, text: str):
    """`tokenizer` seen with another chat template (TRL's checks read `.chat_template` and call
    `apply_chat_template`); the tokenizer itself is left as it is."""
    def apply(messages, **kwargs):
        return tokenizer.apply_chat_template(messages, chat_template=text, **kwargs)

    return types.SimpleNamespace(chat_template=text, apply_chat_template=apply)


def tool_templates(tokenizer) -> list[str]:
    """TRL's templates that render a tool call and its result and whose calls TRL parses: those a tool recipe may set."""
    from trl.chat_template_utils import supports_tool_calling

    found = []
    for name in template_names():
        try:
            if parsed_by_trl(name) and supports_tool_calling(_as(tokenizer, template_text(name))):
                found.append(name)
        except Exception:  # noqa: BLE001 - a template this tokenizer cannot render is not one it may set
            continue
    return found


def training_variant(tokenizer) -> tuple[bool, str | None]:
    """(prefix-preserving, the training template TRL swaps in when it is not: its name, or None when TRL has none)."""
    import trl.chat_template_utils as utils

    if utils.is_chat_template_prefix_preserving(tokenizer):
        return True, None
    try:
        text = utils.get_training_chat_template(tokenizer)
    except ValueError:
        return False, None
    names = [n[: -len("_chat_template")] for n, v in vars(utils).items() if n.endswith("_chat_template") and v == text]
    return False, names[0] if names else "a patched copy"


def thinks(tokenizer, kwargs: dict | None = None) -> bool:
    """Whether the model writes a thinking block before its answer under this template (and the run's
    `chat_template_kwargs`): the generation prompt leaves a `<think>` open, a finished turn is rendered with one
    (the model is to write it), or Gemma 4's `<|think|>` switch is on."""
    kwargs = kwargs or {}
    user = [{"role": "user", "content": "Q"}]
    try:
        prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True, **kwargs)
        whole = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": "A"}], tokenize=False, **kwargs)
    except Exception:  # noqa: BLE001 - a template that cannot render this exchange says nothing of thinking
        return False
    turn = whole[len(prompt):] if whole.startswith(prompt) else ""
    return (prompt.count("<think>") > prompt.count("</think>") or turn.lstrip().startswith("<think>")
            or "<|think|>" in prompt)


def explain(tokenizer, model: dict, kwargs: dict | None = None) -> list[str]:
    """--check's lines on the template of a tool recipe (its problems are `tooluse.template_problems`')."""
    parsed = (getattr(tokenizer, "response_template", None) is not None
              or getattr(tokenizer, "response_schema", None) is not None or _parses(tokenizer.chat_template))
    keeps, variant = training_variant(tokenizer)
    lines = [f"  template      {shown(model)}; TRL parses its tool calls: {'yes' if parsed else 'no'}; "
             + ("prefix-preserving (an earlier turn renders the same whatever follows), as TRL's tool loop needs"
                if keeps else f"not prefix-preserving: TRL's tool loop renders with {variant} (its training template: "
                "an earlier turn renders otherwise once a tool's result follows)")]
    if thinks(tokenizer, kwargs):
        lines.append("  thinking      the model writes a thinking block before each answer or call (in every turn): "
                     "its tokens count in max_completion_length")
    return lines
