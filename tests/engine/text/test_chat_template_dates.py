"""The {today}/{yesterday} placeholders of the published Ministral-3 default system prompt
are filled with ISO dates; the same braces in a user's message are left alone."""

from __future__ import annotations

from datetime import date, timedelta

from engine.text.chat_template import fill_dates, render_chat_template

TEMPLATE = ("{%- set default_system_message = 'Today is {today}, yesterday was {yesterday}.' -%}"
            "[SYSTEM_PROMPT]{{ default_system_message }}[/SYSTEM_PROMPT]"
            "{%- for m in messages %}[INST]{{ m['content'] }}[/INST]{%- endfor %}")


def test_placeholders_are_filled_in_the_template_only():
    text = render_chat_template(TEMPLATE, [{"role": "user", "content": "say {today}"}])
    today = date.today()
    assert f"Today is {today.isoformat()}, yesterday was " \
           f"{(today - timedelta(days=1)).isoformat()}." in text
    assert text.endswith("[INST]say {today}[/INST]")
    assert "{today}" not in text.split("[INST]")[0]


def test_fill_dates_crosses_month_ends_and_leaves_other_sources_alone():
    assert fill_dates("{today}|{yesterday}", date(2026, 3, 1)) == "2026-03-01|2026-02-28"
    assert fill_dates("no placeholders") == "no placeholders"
