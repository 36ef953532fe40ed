"""A chat's output setting and token view in the window, on the tiny model: schema-constrained replies shown
pretty-printed, a schema the engine refuses said on the reply, tokens with probabilities, settings kept."""

from __future__ import annotations

import json
import math

from engine.domain import json_schema
from engine.domain.chat import OutputKind
from tests.app.conftest import settings, wait_idle

# bounded (no free keys, an enum), so even a random model closes the object long before max_tokens
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


def test_a_schema_chat_writes_json_that_shows_pretty_printed(qtbot, make_window) -> None:
    window = make_window()
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=60, output=OutputKind.SCHEMA, json_schema=json.dumps(SCHEMA)))
    assert chat.send("give me the answer as JSON")
    wait_idle(qtbot, chat)
    reply = chat.messages[-1]
    assert reply.error is None and reply.finish_reason == "stop", reply
    value = json.loads(reply.content)
    assert isinstance(value["ok"], bool) and value["n"] in (1, 2, 3)
    view = chat.panel.transcript.views[-1]
    assert [c.text for c in view.code_views] == [json.dumps(value, indent=2)]
    assert view.text == reply.content  # the stored text is the model's own
    assert window.store.load_chat(chat.chat_id).messages[-1].content == reply.content


def test_a_schema_the_engine_refuses_is_said_on_the_reply(qtbot, make_window, monkeypatch) -> None:
    window = make_window()
    chat = window.tabs.current
    refused = {"type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}, "required": ["a"]}
    # the schema editor and a settings file never keep a schema the engine's compiler refuses ...
    assert settings(output=OutputKind.SCHEMA, json_schema=json.dumps(refused)).json_schema == ""
    # ... so the engine's own refusal is reached with one that slipped past them (a check that missed it)
    monkeypatch.setattr(json_schema, "_compiler_problem", lambda schema: None)
    chat.set_settings(settings(output=OutputKind.SCHEMA, json_schema=json.dumps(refused)))
    assert chat.send("hello")
    wait_idle(qtbot, chat)
    reply = chat.messages[-1]
    assert reply.finish_reason == "error" and reply.error.startswith("invalid json_schema")
    assert "\n" not in reply.error
    view = chat.panel.transcript.views[-1]
    assert view.error_label.isVisibleTo(view) and view.error_label.text() == reply.error


def test_token_probabilities_give_each_reply_a_token_view(qtbot, make_window, ignore_eos) -> None:
    window = make_window()
    chat = window.tabs.current
    chat.set_settings(settings(max_tokens=8, show_tokens=True))
    assert chat.send("hello")
    wait_idle(qtbot, chat)
    view = chat.panel.transcript.views[-1]
    entries = view.tokens
    assert len(entries) == chat.messages[-1].stats.output_tokens == 8
    # each token's own text: special tokens the reply's text skips (a random model writes some) show here too
    visible = "".join(e.text for e in entries if not (e.text.startswith("<|") and e.text.endswith("|>")))
    assert visible == chat.messages[-1].content
    assert all(e.logprob is not None and len(e.alternatives) == 5 and len(e.token_ids) == 1 for e in entries)
    assert view.tokens_button.isVisibleTo(view)
    view.tokens_button.click()
    assert view.token_view.isVisibleTo(view) and len(view.token_view.entries) == 8
    tip = view.token_view.tooltip_for(0)
    assert tip.startswith("token “") and "probability" in tip and tip.count("\n  or “") == 5  # the alternatives
    assert all(f"{math.exp(a.logprob):.1%}" in tip for a in entries[0].alternatives)

    chat.set_settings(settings(max_tokens=4))  # off: no token data, none asked for
    chat.regenerate()
    wait_idle(qtbot, chat)
    plain = chat.panel.transcript.views[-1]
    assert plain.tokens == [] and not plain.tokens_button.isVisibleTo(plain)


def test_the_output_settings_are_kept_with_the_chat(qtbot, make_window) -> None:
    window = make_window(load=False)
    chat = window.tabs.current
    chat.set_settings(
        settings(
            output=OutputKind.SCHEMA, json_schema=json.dumps(SCHEMA, indent=2), show_tokens=True, presence_penalty=0.5
        )
    )
    second = window.tabs.new_chat(settings(output=OutputKind.JSON))
    kept = (chat.settings, second.settings)
    window.close()
    reopened = make_window(load=False)
    first, other = reopened.tabs.controllers
    assert (first.settings, other.settings) == kept
    panel = first.panel.sampling
    assert panel.output.currentData() == OutputKind.SCHEMA and panel.show_tokens.isChecked()
    assert panel.presence_penalty.value() == 0.5 and first.settings.to_params().presence_penalty == 0.5
    assert panel.schema_editor.toPlainText() == json.dumps(SCHEMA, indent=2)
    assert panel.schema_status.text().startswith("Valid schema")
    assert other.settings.to_params().structured.kind == "json_object"
