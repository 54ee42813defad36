"""A request's own chat template (--trust-request-chat-template) is compiled before the
render's deadline applies: its length is bounded (2.5 MB took 15 s of a worker thread)."""

import pytest

from service.schemas import MAX_REQUEST_TEMPLATE_CHARS
from tests.service.test_api import client, error_of

MSGS = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("route, extra", [("/v1/chat/completions", {"max_tokens": 2}),
                                          ("/tokenize", {})])
def test_a_request_template_past_the_limit_is_a_400(route, extra):
    big = "{{ messages[0].content }}" + " " * MAX_REQUEST_TEMPLATE_CHARS
    with client(trust_request_chat_template=True) as cl:
        err = error_of(cl.post(route, json={"messages": MSGS, "chat_template": big, **extra}),
                       400)
        assert err["param"] == "chat_template" and "at most" in err["message"]
