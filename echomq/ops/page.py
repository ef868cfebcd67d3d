"""The dashboard's one page, rendered on the server: HTML with an inline SVG chart.

Nothing fetched from elsewhere (machines may have no internet); every value is
escaped. Served by ``echomq dashboard`` (``live``), one small inline script follows the
selected queue's event stream (``/events``, server-sent events): its counts and a list
of its latest events update as jobs change state, without reloading. Elsewhere (the
supervisor's health port, or a browser without scripts) the page reloads itself every
10 s instead. Forms (retry, cancel, pause, resume) appear only when
actions are allowed and the operator signed in with the dashboard token, and
carry the server's form token; the token itself is never written into a page.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f5f6f8}
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:20px;align-items:baseline}
header h1{font-size:18px;margin:0}header span{opacity:.75}
main{padding:16px 20px;display:grid;gap:16px}
section{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:12px 16px}
h2{font-size:15px;margin:0 0 8px}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eef0f3;vertical-align:top}
th{font-weight:600;color:#555}td.n{text-align:right;font-variant-numeric:tabular-nums}
a{color:#2457c5;text-decoration:none}a:hover{text-decoration:underline}
.badge{display:inline-block;padding:1px 6px;border-radius:4px;font-size:12px}
.paused{background:#fde68a}.running{background:#d1fae5}
pre{white-space:pre-wrap;background:#f7f7f9;padding:8px;border-radius:4px;max-height:320px;
overflow:auto;margin:4px 0}
form{display:inline;margin:0}button{font:inherit;padding:2px 10px;cursor:pointer}
.err{color:#a11;font-family:monospace;font-size:12px}.muted{color:#777}
.legend span{margin-right:12px}
#live-events{margin:0;padding-left:20px;max-height:240px;overflow:auto;font-family:monospace;
font-size:12px}
"""

# follows /events of the selected queue: fresh counts and the newest events (at most 50)
LIVE_SCRIPT = """(function(){
var sec=document.getElementById('queue');if(!sec||!window.EventSource)return;
var name=sec.getAttribute('data-queue'),list=document.getElementById('live-events'),
state=document.getElementById('live-state');
var es=new EventSource('/events?queue='+encodeURIComponent(name));
es.onopen=function(){state.textContent='live';};
es.onerror=function(){state.textContent='reconnecting';};
es.onmessage=function(m){var d=JSON.parse(m.data),rows=document.querySelectorAll('#queues tr');
for(var i=0;i<rows.length;i++){if(rows[i].getAttribute('data-queue')!==name)continue;
for(var k in d.counts){var c=rows[i].querySelector('td[data-count="'+k+'"]');
if(c)c.textContent=d.counts[k];}}
d.events.forEach(function(e){var li=document.createElement('li');
li.setAttribute('data-kind',e.kind);li.setAttribute('data-job',e.job_id);
li.textContent=e.at.substr(11,12)+' '+e.kind+' '+e.job_id+(e.lane?' lane '+e.lane:'')+
(e.attempt?' attempt '+e.attempt:'')+(e.reason?' ('+e.reason+')':'');
list.insertBefore(li,list.firstChild);});
while(list.children.length>50)list.removeChild(list.lastChild);};
})();"""


def esc(value: Any) -> str:
    """HTML-escape a value for text or an attribute (non-strings as JSON; None as empty)."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                           default=str)
    return html.escape(text, quote=True)


def when(ms: int | None) -> str:
    """A millisecond timestamp as UTC `YYYY-MM-DD HH:MM:SS` (empty for 0 or None)."""
    if not ms:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def link(**params: str) -> str:
    """A link to the page with these query parameters."""
    return "/?" + urlencode(params)


def action_form(token: str, action: str, label: str, queue: str, job: str = "") -> str:
    """A POST form for one action; ``token`` is the form token (never the dashboard's)."""
    fields = {"action": action, "queue": queue, "csrf": token}
    if job:
        fields["job"] = job
    hidden = "".join(f'<input type="hidden" name="{k}" value="{esc(v)}">'
                     for k, v in fields.items())
    return (f'<form method="post" action="/action" class="{action}-form">{hidden}'
            f'<button type="submit" data-action="{action}">{esc(label)}</button></form>')


COUNTS = ("waiting", "scheduled", "active", "completed", "dead", "cancelled", "blocked")


def queues_table(rows: Sequence[dict[str, Any]], token: str | None) -> str:
    """The table of every queue's counts and state (with pause/resume buttons given a token)."""
    if not rows:
        return '<section id="queues"><h2>Queues</h2><p class="muted">no queues yet</p></section>'
    head = "".join(f"<th>{c}</th>" for c in ("queue", *COUNTS, "state"))
    if token:
        head += "<th></th>"
    body = []
    for r in rows:
        name = r["queue"]
        state = ('<span class="badge paused">paused</span>' if r["paused"]
                 else '<span class="badge running">running</span>')
        cells = "".join(f'<td class="n" data-count="{c}">{r[c]}</td>' for c in COUNTS)
        act = ""
        if token:
            act = "<td>" + (action_form(token, "resume", "Resume", name) if r["paused"]
                            else action_form(token, "pause", "Pause", name)) + "</td>"
        body.append(f'<tr data-queue="{esc(name)}"><td><a href="{esc(link(queue=name))}">'
                    f"{esc(name)}</a></td>{cells}<td>{state}</td>{act}</tr>")
    return (f'<section id="queues"><h2>Queues</h2><table><tr>{head}</tr>{"".join(body)}'
            "</table></section>")


def chart(rates: Sequence[tuple[float, float, float]], width: int = 720, height: int = 140
          ) -> str:
    """Bars of completed per minute, a line of failure rate (right axis, 0–100 %)."""
    if not rates:
        return '<p class="muted">collecting samples: the chart fills in as the page stays up</p>'
    top = max(1.0, *(c + f for _, c, f in rates))
    n = len(rates)
    bar_w = width / max(n, 1)
    bars, points = [], []
    for i, (_, done, failed) in enumerate(rates):
        x = i * bar_w
        h_done = height * done / top
        h_fail = height * failed / top
        bars.append(f'<rect x="{x:.1f}" y="{height - h_done:.1f}" width="{bar_w * 0.8:.1f}" '
                    f'height="{h_done:.1f}" fill="#4f7fe0"/>')
        if h_fail:
            bars.append(f'<rect x="{x:.1f}" y="{height - h_done - h_fail:.1f}" '
                        f'width="{bar_w * 0.8:.1f}" height="{h_fail:.1f}" fill="#e0604f"/>')
        total = done + failed
        rate = failed / total if total else 0.0
        points.append(f"{x + bar_w * 0.4:.1f},{height - rate * height:.1f}")
    line = (f'<polyline points="{" ".join(points)}" fill="none" stroke="#222" '
            'stroke-width="1.5" stroke-dasharray="4 2"/>')
    last = rates[-1]
    return (f'<svg id="throughput" viewBox="0 0 {width} {height}" width="100%" '
            f'height="{height}" role="img" aria-label="throughput">{"".join(bars)}{line}</svg>'
            '<div class="legend muted">'
            f'<span style="color:#4f7fe0">■ completed/min (last {last[1]:.0f})</span>'
            f'<span style="color:#e0604f">■ failed/min (last {last[2]:.0f})</span>'
            "<span>- - failure rate (0–100 %)</span>"
            f"<span>top of scale {top:.0f}/min, {n} intervals</span></div>")


def limit_text(limit: dict[str, Any] | None) -> str:
    """The queue-wide limit for the queue's line ("" when none is set)."""
    if not limit or (limit["max_active"] is None and limit["rate"] is None):
        return ""
    parts = []
    if limit["max_active"] is not None:
        parts.append(f"at most {limit['max_active']} active")
    if limit["rate"] is not None:
        parts.append(f"{limit['rate']} starts per {limit['per_s'] or 1:g} s")
    return f' · <span id="queue-limit">queue limit: {esc(", ".join(parts))}</span>'


def queue_detail(s: dict[str, Any], rates: Sequence[tuple[float, float, float]],
                 dead: Sequence[Any], token: str | None, live: bool = False) -> str:
    """One queue's section: counts, throughput chart, busiest lanes and dead jobs."""
    name = s["queue"]
    state = "paused" if s["paused"] else "running"
    lanes = "".join(f'<tr><td>{esc(x["lane"])}</td><td class="n">{x["waiting"]}</td></tr>'
                    for x in s["busiest_lanes"]) or '<tr><td class="muted">none</td></tr>'
    oldest = s["oldest_waiting_s"]
    scanned = (f' <span class="muted">(looked at {s["lanes_scanned"]} of {s["lanes"]} '
               "lanes)</span>" if s["lanes_scanned"] < s["lanes"] else "")
    dead_rows = []
    for j in dead:
        err = (j.error or "").strip().splitlines()
        retry = f"<td>{action_form(token, 'retry', 'Retry', name, j.id)}</td>" if token else ""
        dead_rows.append(
            f'<tr data-job="{esc(j.id)}"><td><a href="{esc(link(queue=name, job=j.id))}">'
            f"{esc(j.id)}</a></td><td>{esc(j.name)}</td><td>{esc(j.lane)}</td>"
            f'<td class="n">{j.attempts}</td><td>{when(j.finished_ms)}</td>'
            f'<td class="err">{esc(err[-1] if err else "")}</td>{retry}</tr>')
    dead_html = ("<table><tr><th>id</th><th>name</th><th>lane</th><th>attempts</th>"
                 "<th>died</th><th>error</th>" + ("<th></th>" if token else "") + "</tr>"
                 + "".join(dead_rows) + "</table>") if dead_rows else \
        '<p class="muted">no dead jobs</p>'
    return (
        f'<section id="queue" data-queue="{esc(name)}"><h2>Queue {esc(name)} '
        f'<span class="badge {state}" id="pause-state">{state}</span></h2>'
        f"<p>retried {s['retried']} · spilled to the floor {s['spilled']} · lanes with work "
        f"{s['lanes']}" + (f" · oldest waiting {oldest:.1f} s" if oldest is not None else "")
        + limit_text(s.get("queue_limit"))
        + '</p><form method="get" action="/" id="lookup">'
        f'<input type="hidden" name="queue" value="{esc(name)}">'
        '<input name="job" placeholder="job id" size="34" aria-label="job id"> '
        '<button type="submit">Show job</button></form>'
        f"<h2>Throughput and failure rate</h2>{chart(rates)}</section>"
        f'<section id="lanes"><h2>Busiest lanes{scanned}</h2><table><tr><th>lane</th>'
        f"<th>waiting</th></tr>{lanes}</table></section>"
        f'<section id="dead"><h2>Dead jobs (oldest {len(dead)})</h2>{dead_html}</section>'
        + ('<section id="live"><h2>Latest events <span class="badge" id="live-state">'
           'connecting</span></h2><ol id="live-events" reversed></ol></section>'
           if live else ""))


def job_detail(queue: str, job: Any, token: str | None) -> str:
    """One job's section: its fields, error text and, given a token, a retry button."""
    if job is None:
        return '<section id="job"><h2>Job</h2><p class="muted">no such job</p></section>'
    rows = []
    for key in ("id", "name", "state", "lane", "attempts", "max_attempts", "stalls"):
        rows.append(f"<tr><th>{key}</th><td>{esc(getattr(job, key))}</td></tr>")
    for key in ("created_ms", "due_ms", "started_ms", "finished_ms"):
        if getattr(job, key):
            rows.append(f"<tr><th>{key[:-3]}</th><td>{when(getattr(job, key))}</td></tr>")
    buttons = ""
    if token and job.state == "dead":
        buttons = action_form(token, "retry", "Retry", queue, job.id)
    elif token and job.state in ("waiting", "scheduled", "active"):
        buttons = action_form(token, "cancel", "Cancel", queue, job.id)
    parts = [f'<section id="job" data-job="{esc(job.id)}"><h2>Job {esc(job.id)} {buttons}</h2>'
             f"<table>{''.join(rows)}</table>",
             f"<h2>payload</h2><pre>{esc(json.dumps(job.payload, indent=2, default=str))}</pre>"]
    if job.result is not None:
        parts.append(f"<h2>result</h2><pre>{esc(job.result)}</pre>")
    if job.error:
        parts.append(f'<h2>error</h2><pre class="err">{esc(job.error)}</pre>')
    return "".join(parts) + "</section>"


def login_link() -> str:
    """The header's link to the login form."""
    return '<a id="login" href="/login" style="color:#fff">log in to act</a>'


def logout_form(form_token: str) -> str:
    """The header's log out button (a POST form carrying the form token)."""
    return ('<form method="post" action="/logout" id="logout">'
            f'<input type="hidden" name="csrf" value="{esc(form_token)}">'
            '<button type="submit">log out</button></form>')


def login_page(where: str, form_token: str, failed: bool = False) -> str:
    """The form where an operator enters the dashboard token (sent once, by POST)."""
    wrong = '<p class="err" id="login-failed">wrong dashboard token</p>' if failed else ""
    body = ('<section id="login-form"><h2>Log in to act</h2>'
            "<p>Retry, cancel, pause and resume need the dashboard token "
            f"(<code>ECHOMQ_DASHBOARD_TOKEN</code>).</p>{wrong}"
            '<form method="post" action="/login">'
            f'<input type="hidden" name="csrf" value="{esc(form_token)}">'
            '<input type="password" name="token" autocomplete="current-password" '
            'aria-label="dashboard token" size="40" required> '
            '<button type="submit">Log in</button></form></section>')
    return page(where, True, body, refresh=False)


def page(where: str, allow_actions: bool, body: str, refresh: bool, notice: str = "",
         account: str = "", live: bool = False) -> str:
    """The whole page around ``body``; ``account``: the log in link or log out form;
    ``live``: updated from the event stream (reloaded every 10 s only without scripts)."""
    mode = "actions allowed" if allow_actions else "read-only"
    meta = '<meta http-equiv="refresh" content="10">' if refresh else ""
    script = ""
    if live:
        meta = f"<noscript>{meta}</noscript>" if meta else ""
        script = f"<script>{LIVE_SCRIPT}</script>"
    note = f'<section id="notice">{esc(notice)}</section>' if notice else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<link rel="icon" href="data:,">{meta}<title>EchoMQ</title><style>{STYLE}</style>'
        f'</head><body><header><h1><a href="/" style="color:#fff">EchoMQ</a></h1>'
        f"<span>{esc(where)}</span><span>{mode}</span>"
        f"<span>{datetime.now(UTC).strftime('%H:%M:%S UTC')}</span>{account}</header>"
        f"<main>{note}{body}</main>{script}</body></html>"
    )
