"""State kept between requests: the Responses API's stored responses (responses.py)."""
