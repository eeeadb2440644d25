"""The HTML summaries notebooks show (`_repr_html_`): short, escaped, and never raising. Each asks
the driver one question at most, waiting QUICK seconds for it."""

from __future__ import annotations

import concurrent.futures
import html
import urllib.parse

# How long a summary waits for the driver's answer, in seconds.
QUICK = 2.0
# The most characters of an error a summary shows.
LONGEST = 300


def safe_url(url) -> str:
    """`url` (or a list of them) without user names, passwords or tokens."""
    if not isinstance(url, str):
        return ", ".join(safe_url(u) for u in url)
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.netloc and "@" in parts.netloc:
            parts = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1])
        return urllib.parse.urlunsplit(parts)
    except ValueError:
        return "(a URL that does not parse)"


def guarded(summarize, thing) -> str:
    """`summarize(thing)`, or a line saying why it could not be made."""
    try:
        return summarize(thing)
    except Exception as error:
        return (
            f"<pre>{html.escape(_plain_repr(thing))}: no summary "
            f"({html.escape(type(error).__name__)}: {html.escape(str(error))})</pre>"
        )


def _plain_repr(thing) -> str:
    try:
        return repr(thing)
    except Exception:
        return object.__repr__(thing)


def _table(title: str, rows, web_url=None) -> str:
    cells = "".join(
        f'<tr><th style="text-align:left">{html.escape(str(key))}</th>'
        f'<td style="text-align:left">{html.escape(str(value))}</td></tr>'
        for key, value in rows
    )
    if web_url:
        url = html.escape(web_url, quote=True)
        cells += (
            f'<tr><th style="text-align:left">web page</th><td style="text-align:left">'
            f'<a href="{url}" target="_blank">{url}</a></td></tr>'
        )
    return f"<div><strong>{html.escape(title)}</strong><table>{cells}</table></div>"


def _web_url(sync_client):
    url = getattr(sync_client, "web_url", None)
    return url if isinstance(url, str) and url.startswith(("http://", "https://")) else None


def _ask(sync_client, coroutine):
    """The answer of `coroutine` on the client's loop within QUICK seconds, or why not."""
    if sync_client.closed:
        coroutine.close()
        return None, "the client is closed"
    try:
        return sync_client._run(coroutine, QUICK), None
    except Exception as error:
        why = str(error) or type(error).__name__
        if isinstance(error, (TimeoutError, concurrent.futures.TimeoutError)):
            why = f"no answer within {QUICK:g}s"
        return None, why


def client(sync_client) -> str:
    """A `SyncClient`: its server, cluster, executors and cores, and the web page."""
    rows = [("server", safe_url(sync_client.url)), ("cluster", sync_client.cluster)]
    answer, why = _ask(
        sync_client,
        sync_client.client._expect({"type": "ListExecutors", "limit": 0}, "Executors"),
    )
    if answer is None:
        rows.append(("executors", f"unknown: {why}"))
    else:
        rows.append(("executors", answer.get("registered_executors", 0)))
        rows.append(("cores", answer.get("total_cores", 0)))
        if answer.get("pending_executors"):
            rows.append(("executors expected", answer["pending_executors"]))
    return _table("ember.SyncClient", rows, _web_url(sync_client))


def job(sync_job) -> str:
    """A `SyncJob`: its id, name, state and tasks by state, and the web page."""
    owner = sync_job._owner
    rows = [("job", sync_job.job_id)]
    summary, why = _ask(owner, sync_job.job.summary())
    if summary is None:
        rows.append(("state", f"unknown: {why}"))
    else:
        if summary.get("name"):
            rows.append(("name", summary["name"]))
        rows.append(("state", summary.get("state")))
        rows.append(("tasks", summary.get("tasks")))
        for key in ("succeeded", "failed", "killed", "running"):
            rows.append((key, summary.get(key, 0)))
        if summary.get("reason"):
            rows.append(("reason", summary["reason"]))
    return _table("ember job", rows, _web_url(owner))


def future(fut) -> str:
    """An `ember.Future`: pending, running, finished, cancelled or error, its job and the web
    page. Only a pending one asks the driver whether its call runs yet."""
    owner = fut._owner
    if fut.cancelled():
        state = "cancelled"
    elif fut.done():
        error = fut.exception()
        state = "finished" if error is None else f"error: {type(error).__name__}: {error}"
        if len(state) > LONGEST:
            state = state[: LONGEST - 1] + "…"
    else:
        summary, _ = _ask(owner, fut.job.job.summary())
        state = "running" if summary and summary.get("running") else "pending"
    return _table("ember.Future", [("state", state), ("job", fut.job_id)], _web_url(owner))
