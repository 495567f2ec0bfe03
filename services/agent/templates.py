"""Chat templating for token-in, token-out episodes.

An episode's token sequence is built by appending, never by re-rendering: the prompt's ids, then the
exact ids the model generated, then ids the template would put between that assistant message and the
next generation (the message's closing tokens, the observations, the generation prompt). Those
in-between ids come from rendering a fixed reference conversation with and without the new messages
and tokenizing the difference; it starts right after a closed assistant message, where every chat
template this project meets (ChatML, Qwen, Llama 3) starts a special token, so tokenizing it alone gives
the same ids as tokenizing it in place.
"""
from __future__ import annotations

from typing import Any, Sequence

from coevolve.services.envs.base import Message

_MARK = "\u2063coevolve-assistant-content\u2063"
_REFERENCE = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]


class TemplateError(ValueError):
    """The tokenizer's chat template cannot be extended message by message."""


def chat_messages(messages: Sequence[Message], first: bool) -> list[dict[str, Any]]:
    """Messages as a chat template takes them: role, content and a tool's name.

    A system message after the first position becomes a user message, since some templates (Qwen3's)
    refuse a system message anywhere but first.
    """
    out = []
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "system" and not (first and i == 0):
            role = "user"
        item: dict[str, Any] = {"role": role, "content": str(message.get("content", ""))}
        if role == "tool" and message.get("name"):
            item["name"] = message["name"]
        out.append(item)
    return out


class ChatTemplate:
    """A tokenizer's chat template, split into the pieces an episode appends."""

    def __init__(self, tokenizer: Any, tools_in_template: bool = False):
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.tools_in_template = tools_in_template
        closed = self._render(_REFERENCE + [{"role": "assistant", "content": _MARK}])
        if _MARK not in closed:
            raise TemplateError("the chat template drops assistant content")
        self._closed_reference = closed
        self.assistant_end = closed.split(_MARK, 1)[1]
        """What the template writes after an assistant message's content (ChatML: `<|im_end|>\\n`)."""

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool = False,
                tools: list[dict[str, Any]] | None = None) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The first prompt: system prompt and user turn, with the generation prompt."""
        tools = None
        if self.tools_in_template and messages and messages[0].get("tools"):
            tools = list(messages[0]["tools"])
        return self.encode(self._render(chat_messages(messages, first=True), True, tools))

    def conversation_ids(self, messages: Sequence[Message]) -> list[int]:
        """A whole conversation rendered at once, with the generation prompt (for one-off requests)."""
        return self.encode(self._render(chat_messages(messages, first=True), True))

    def close_ids(self, generated: Sequence[int]) -> list[int]:
        """Ids that close an assistant message after the generated ones.

        A generation that stopped on the end-of-message token already holds it; one cut by the token
        limit does not, and gets the whole closing text.
        """
        end = self.assistant_end
        if generated:
            last = self.tokenizer.decode([generated[-1]], skip_special_tokens=False)
            if last and end.startswith(last):
                end = end[len(last):]
        return self.encode(end) if end else []

    def continuation_ids(self, observations: Sequence[Message]) -> list[int]:
        """Ids of observations after a closed assistant message, ending with the generation prompt."""
        rendered = self._render(_REFERENCE + [{"role": "assistant", "content": _MARK}]
                                + chat_messages(observations, first=False), True)
        if not rendered.startswith(self._closed_reference):
            raise TemplateError("the chat template re-renders earlier messages when new ones follow")
        return self.encode(rendered[len(self._closed_reference):])

    def stop_token_ids(self) -> list[int]:
        """Token ids that end an assistant message: the end-of-sequence token and the template's end."""
        ids = {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        end = self.assistant_end.strip()
        if end:
            end_ids = self.encode(end)
            if len(end_ids) == 1:
                ids.add(end_ids[0])
        return sorted(ids)
