"""`radixkv bench answers`: does a server give one answer per question?

Sixteen chat questions share a ~400-token system prompt; each is answered greedily three ways:
- cold: alone, right after the server's prefix cache was emptied (`--flush-path`: RadixKV's
  `/flush_cache`, vLLM's `/reset_prefix_cache`);
- cached: alone, with the system prompt already cached (one warm-up request first);
- batched: all sixteen sent at once.
The report counts the questions whose three answers are the same text and token count (with
`--logprobs`, also the same log-probabilities). Any OpenAI-compatible server works, so the
same check runs against RadixKV and its peers with their own defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

SYSTEM = (
    "You are the support assistant of Orchard Street Library. Policies you must follow: "
    "Members may borrow up to twelve items at a time; DVDs and games count as items. Loans last "
    "three weeks and can be renewed twice online or at the desk unless someone else has placed a "
    "hold. Overdue fines were abolished in 2021, but items more than sixty days overdue are "
    "billed at replacement cost, and the bill is cancelled when the item is returned in good "
    "condition. Holds are free; a held item waits seven days at the pickup branch. Interlibrary "
    "loans cost two dollars each and take two to four weeks. The makerspace (3D printers, laser "
    "cutter, sewing machines) requires a one-time safety session, offered Tuesdays at 6 pm and "
    "Saturdays at 10 am. Study rooms seat up to six, may be booked up to fourteen days ahead for "
    "two hours per day, and must be claimed within fifteen minutes. Children under ten must be "
    "accompanied by an adult. The library card is free for residents, students and employees of "
    "the county; others pay forty dollars a year. Lost cards are replaced for one dollar. Wi-Fi "
    "is open with no password; printing costs ten cents a page, color fifty cents. The main "
    "branch opens 9 am to 8 pm Monday to Thursday, 9 to 6 Friday and Saturday, noon to 5 Sunday; "
    "the east branch closes at 6 pm every day and all day Monday. Donations of books published "
    "in the last five years are accepted at the east branch on Saturdays. Answer in two or three "
    "sentences, be precise about numbers, and say so when a policy does not cover the question."
)

QUESTIONS = (
    "How many DVDs can I borrow at once?",
    "I lost my card. What do I do and what does it cost?",
    "Is there a fine if I return a book two weeks late?",
    "What happens if my book is 70 days overdue?",
    "Can I book a study room for next month?",
    "When can I take the makerspace safety session?",
    "I live in another county. Can I get a card?",
    "How long does an interlibrary loan take?",
    "Is the east branch open on Monday?",
    "Can my eight-year-old come to the library alone?",
    "How much does it cost to print five color pages?",
    "Can I renew a book that someone has placed a hold on?",
    "Where can I donate old encyclopedias from 1995?",
    "What time does the main branch close on Sunday?",
    "Do I need a password for the Wi-Fi?",
    "How long will a held item wait for me?",
)


def _ask(client: httpx.Client, args: argparse.Namespace, question: str) -> tuple[Any, ...]:
    body: dict[str, Any] = {
        "model": args.model,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "temperature": 0.0,
        "max_tokens": args.max_tokens,
    }
    if args.logprobs:
        body["logprobs"] = True
    r = client.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    lps = None
    if args.logprobs:
        lps = tuple(t["logprob"] for t in choice["logprobs"]["content"])
    return choice["message"]["content"], r.json()["usage"]["completion_tokens"], lps


def _flush(client: httpx.Client, path: str) -> None:
    r = client.post(path)
    if r.status_code >= 400:
        raise RuntimeError(f"{path} answered {r.status_code}: {r.text[:200]}")


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    """The three answers of every question and the counts of agreement."""
    questions = QUESTIONS[: args.questions]
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with httpx.Client(base_url=args.url, timeout=args.timeout, headers=headers) as client:
        if args.model is None:
            args.model = client.get("/v1/models").json()["data"][0]["id"]
        cold = []
        for q in questions:
            _flush(client, args.flush_path)
            cold.append(_ask(client, args, q))
        _flush(client, args.flush_path)
        _ask(client, args, "Hello!")  # caches the system prompt
        cached = [_ask(client, args, q) for q in questions]
        _flush(client, args.flush_path)
        with ThreadPoolExecutor(len(questions)) as pool:
            batched = list(pool.map(lambda q: _ask(client, args, q), questions))
    rows = [
        {"question": q, "cold": c[0], "cached_same": c == w, "batched_same": c == b}
        for q, c, w, b in zip(questions, cold, cached, batched, strict=True)
    ]
    return {
        "url": args.url,
        "model": args.model,
        "max_tokens": args.max_tokens,
        "logprobs": args.logprobs,
        "questions": len(rows),
        "cold_vs_cached": sum(r["cached_same"] for r in rows),
        "cold_vs_batched": sum(r["batched_same"] for r in rows),
        "all_three": sum(r["cached_same"] and r["batched_same"] for r in rows),
        "rows": rows,
    }


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    p.add_argument("--model", default=None, help="model name (default: the server's first)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--questions", type=int, default=len(QUESTIONS), help="how many (max 16)")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--logprobs", action="store_true", help="also compare log-probabilities")
    p.add_argument(
        "--flush-path",
        default="/flush_cache",
        help="route that empties the prefix cache (vLLM: /reset_prefix_cache)",
    )
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", default=None, help="write the full result here")


def _main(args: argparse.Namespace) -> int:
    result = run_check(args)
    n = result["questions"]
    print(f"{args.url} ({result['model']}), {n} questions, greedy, {args.max_tokens} tokens")
    print(f"  cold vs cached:  {result['cold_vs_cached']}/{n} identical")
    print(f"  cold vs batched: {result['cold_vs_batched']}/{n} identical")
    print(f"  all three:       {result['all_three']}/{n} identical")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0 if result["all_three"] == n else 1


def register(sub: Any) -> None:
    p = sub.add_parser("answers", help="does a server give one answer per question?")
    add_args(p)
    p.set_defaults(func=_main)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_args(parser)
    sys.exit(_main(parser.parse_args()))
