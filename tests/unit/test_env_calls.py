"""The call parser: BFCL and JSON call syntax in, literal calls or clear rejections out, nothing run."""
from __future__ import annotations

import json

import pytest

from coevolve.services.envs.calls import Call, CallLimits, Rejected, parse_action


def only_calls(text):
    action = parse_action(text)
    assert not action.ends_turn, text
    return action.calls


def test_bfcl_list_syntax_gives_names_and_literal_arguments():
    calls = only_calls("[cd(folder='document'), ls(), sort('a.txt'), f(x=-1.5, y=[1, (2, 3)], z={'k': None})]")
    assert calls == (Call("cd", (), {"folder": "document"}), Call("ls"), Call("sort", ("a.txt",)),
                     Call("f", (), {"x": -1.5, "y": [1, (2, 3)], "z": {"k": None}}))


def test_single_call_without_brackets_and_tagged_forms():
    assert only_calls("ls(a=True)") == (Call("ls", (), {"a": True}),)
    assert only_calls("<TOOLCALL>[pwd()]</TOOLCALL>") == (Call("pwd"),)
    assert only_calls("```python\n[pwd()]\n```") == (Call("pwd"),)
    assert only_calls("<think>The user wants ls(). Call it.</think>\n[ls()]") == (Call("ls"),)
    assert parse_action("<think>maybe ls()</think>All done.").ends_turn


@pytest.mark.parametrize("text", [
    '{"name": "cd", "arguments": {"folder": "document"}}',
    '[{"name": "cd", "arguments": {"folder": "document"}}]',
    '{"name": "cd", "arguments": "{\\"folder\\": \\"document\\"}"}',
    '{"function": "cd", "parameters": {"folder": "document"}}',
    '{"type": "function", "function": {"name": "cd", "arguments": "{\\"folder\\": \\"document\\"}"}}',
    'Let me move there.\n<tool_call>\n{"name": "cd", "arguments": {"folder": "document"}}\n</tool_call>',
    '```json\n[{"name": "cd", "arguments": {"folder": "document"}}]\n```',
])
def test_json_tool_calls_in_the_forms_chat_templates_emit(text):
    assert only_calls(text) == (Call("cd", (), {"folder": "document"}),)


def test_several_tool_call_blocks_keep_their_order():
    text = "".join(f'<tool_call>{json.dumps({"name": n, "arguments": {}})}</tool_call>' for n in ("pwd", "ls"))
    assert [c.name for c in only_calls(text)] == ["pwd", "ls"]


@pytest.mark.parametrize("text", ["", "   ", "[]", "I moved the file for you.", "Done.",
                                  "The answer is 42", "```\nno calls here\n```"])
def test_output_that_is_not_a_call_ends_the_turn(text):
    assert parse_action(text).ends_turn


@pytest.mark.parametrize("text, reason", [
    ("__import__('os').system('touch /tmp/pwned')", "attribute access"),
    ("os.system('x')", "attribute access"),
    ("ls.__globals__['x']()", "subscript"),
    ("(lambda: __import__('os'))()", "lambda"),
    ("lambda: 0", "lambda expressions are not tool calls"),
    ("ls(a=lambda: 0)", "lambda expressions are not accepted"),
    ("ls(a=open('x'))", "call expressions are not accepted"),
    ("ls(a=b)", "'b' is a name"),
    ("ls(a=1+2)", "binop expressions are not accepted"),
    ("ls(a=f'{x}')", "joinedstr expressions are not accepted"),
    ("ls(*[1])", "'*' unpacking"),
    ("ls(**{'a': 1})", "'**' unpacking"),
    ("ls(a={**{}})", "'**' unpacking"),
    ("ls(a=b'x')", "bytes literals"),
    ("ls(a=1, a=2)", "given twice"),
    ("[ls(), 5]", "not a function call"),
    ("ls(", "could not parse"),
])
def test_code_that_is_not_a_plain_literal_call_is_rejected(text, reason):
    rejected = [c for c in only_calls(text) if isinstance(c, Rejected)]
    assert rejected and reason in rejected[-1].reason


def test_valid_calls_beside_a_rejected_one_survive():
    calls = only_calls("[pwd(), os.system('x'), ls()]")
    assert isinstance(calls[1], Rejected)
    assert calls[0] == Call("pwd") and calls[2] == Call("ls")


def test_huge_and_deep_inputs_are_rejected_not_parsed():
    limits = CallLimits()
    huge = only_calls("echo(content='" + "x" * (limits.max_chars + 1) + "')")
    assert "over the limit" in huge[0].reason
    deep = only_calls("ls(a=" + "[" * 40 + "]" * 40 + ")")
    assert "nested deeper" in deep[0].reason
    very_deep = only_calls("ls(a=" + "[" * 5000 + "]" * 5000 + ")")
    assert isinstance(very_deep[0], Rejected)
    many = only_calls("ls(a=[" + "1," * 6000 + "])")
    assert "too many values" in many[0].reason
    deep_json = only_calls('{"name": "ls", "arguments": {"a": ' + "[" * 5000 + "]" * 5000 + "}}")
    assert isinstance(deep_json[0], Rejected)
    nested_json = only_calls('{"name": "ls", "arguments": {"a": ' + "[" * 40 + "]" * 40 + "}}")
    assert "nested deeper" in nested_json[0].reason
    assert isinstance(only_calls("ls(a=" + "9" * 5000 + ")")[0], Rejected)


@pytest.mark.parametrize("text", ['{"arguments": {}}', '{"name": "os.system", "arguments": {}}',
                                  '{"name": "ls", "arguments": [1]}', '{"name": "ls", "arguments": "{bad"}',
                                  '{"name": ', '[{"name": "ls"}, 3]'])
def test_malformed_json_calls_are_rejected(text):
    assert any(isinstance(c, Rejected) for c in only_calls(text))


def test_a_list_of_single_calls_from_the_scorer():
    calls = parse_action(["cd(folder='a')", {"name": "ls", "arguments": {}}, "[pwd(), ls()]", "hello"]).calls
    assert calls[:2] == (Call("cd", (), {"folder": "a"}), Call("ls"))
    assert all(isinstance(c, Rejected) and "exactly one" in c.reason for c in calls[2:])
    assert parse_action([]).ends_turn
    odd = parse_action([{"name": "ls", "arguments": {"a": object()}}, {"name": "ls", "arguments": {"a": {1: 2}}}])
    assert all(isinstance(c, Rejected) for c in odd.calls)


def test_render_round_trips_through_the_parser():
    call = Call("f", ("a'b",), {"x": [1, 2.5, None], "y": {"k": (True, -3)}})
    assert only_calls(call.render()) == (call,)
