"""Other APIs translated onto the chat run (service/chat_run.py): Anthropic's Messages
(anthropic.py) and OpenAI's Responses (responses.py); their request models live in
schemas/ (messages.py, responses.py)."""
