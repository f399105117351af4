"""The Responses API's stored responses (`store: true`), for `previous_response_id` and
`GET /v1/responses/{id}`: bounded and in memory, the least recently used dropped first.

An entry keeps the response object and the conversation it ends — every input item up to and
including its own output — so a follow-up continues from it without the client resending the
history. A follow-up's conversation is the previous one's list plus its new items: the item
dicts are shared, not copied, so a long chain costs its new items plus one pointer per item.
The bounds count entries and the characters of the items each entry added."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_RESPONSES = 4096
MAX_CHARS = 256 * 2**20  # ~256 MiB of stored text, at most


@dataclass
class StoredResponse:
    response: dict[str, Any]
    conversation: list[dict[str, Any]]  # input items, this response's output items last
    chars: int  # the size of what this entry added


class ResponseStore:
    """id → StoredResponse, least recently used evicted past `max_responses` / `max_chars`."""

    def __init__(self, max_responses: int = MAX_RESPONSES, max_chars: int = MAX_CHARS) -> None:
        self.max_responses = max_responses
        self.max_chars = max_chars
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(
        self,
        response: dict[str, Any],
        history: list[dict[str, Any]],
        new_items: list[dict[str, Any]],
    ) -> None:
        """Store `response`, whose conversation is `history` (a stored one) + `new_items`."""
        chars = len(json.dumps(new_items)) + len(json.dumps(response))
        self.delete(response["id"])
        self._entries[response["id"]] = StoredResponse(response, [*history, *new_items], chars)
        self._chars += chars
        while self._entries and (
            len(self._entries) > self.max_responses or self._chars > self.max_chars
        ):
            _, old = self._entries.popitem(last=False)
            self._chars -= old.chars

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._chars -= entry.chars
        return True
