"""Chat templating split into the pieces an episode appends, on an in-memory ChatML tokenizer."""
import pytest

from coevolve.services.agent.templates import ChatTemplate, TemplateError, chat_messages
from tests.agent_helpers import byte_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def template(tokenizer):
    return ChatTemplate(tokenizer)


def test_the_prompt_is_the_rendered_conversation_with_a_generation_prompt(template, tokenizer):
    messages = [{"role": "system", "content": "tools here", "tools": [{"x": 1}]}, {"role": "user", "content": "hi"}]
    ids = template.prompt_ids(messages)
    assert tokenizer.decode(ids) == ("<|im_start|>system\ntools here<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                                     "<|im_start|>assistant\n")


def test_the_assistant_end_is_read_from_the_template(template):
    assert template.assistant_end == "<|im_end|>\n"


def test_a_generation_that_stopped_on_the_end_token_gets_only_the_rest_of_the_closing_text(template, tokenizer):
    generated = tokenizer.encode("ok", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert tokenizer.decode(template.close_ids(generated)) == "\n"


def test_a_generation_cut_by_the_token_limit_is_closed_by_the_whole_closing_text(template, tokenizer):
    generated = tokenizer.encode("[cd(fol", add_special_tokens=False)
    assert tokenizer.decode(template.close_ids(generated)) == "<|im_end|>\n"
    assert template.close_ids(generated)[0] == tokenizer.eos_token_id


def test_observations_continue_with_their_messages_and_the_next_generation_prompt(template, tokenizer):
    ids = template.continuation_ids([{"role": "tool", "name": "ls", "content": "a b"},
                                     {"role": "user", "content": "next"}])
    assert tokenizer.decode(ids) == ("<|im_start|>tool\na b<|im_end|>\n<|im_start|>user\nnext<|im_end|>\n"
                                     "<|im_start|>assistant\n")


def test_a_system_message_after_the_first_is_sent_as_a_user_message():
    out = chat_messages([{"role": "system", "content": "a"}, {"role": "user", "content": "b"},
                         {"role": "system", "content": "New functions"}], first=True)
    assert [m["role"] for m in out] == ["system", "user", "user"]
    assert chat_messages([{"role": "system", "content": "x"}], first=False)[0]["role"] == "user"


def test_only_role_content_and_a_tool_name_reach_the_template():
    out = chat_messages([{"role": "tool", "name": "ls", "content": 3, "tools": []}], first=False)
    assert out == [{"role": "tool", "name": "ls", "content": "3"}]


def test_stop_ids_hold_the_end_of_message_token(template, tokenizer):
    assert template.stop_token_ids() == [tokenizer.eos_token_id]


def test_a_tokenizer_without_a_chat_template_is_refused():
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(TemplateError, match="no chat template"):
        ChatTemplate(tokenizer)


def test_a_template_that_rewrites_history_is_refused(tokenizer):
    tok = byte_tokenizer()
    # Renders the message count first, so adding a message changes what came before.
    tok.chat_template = "{{ messages|length }}" + tok.chat_template
    with pytest.raises(TemplateError, match="re-renders"):
        ChatTemplate(tok).continuation_ids([{"role": "user", "content": "x"}])
