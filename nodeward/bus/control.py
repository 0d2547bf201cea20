"""Operator controls over core NATS request/reply: a service serves them, the CLI sends them.

A service registers a plain async function per verb, as it registers consumers:
`await bus.control(service, verb, handler)`, where `async def handler(request:
ControlRequest) -> ControlReply`. The runtime subscribes `control.<service>.<verb>` in the
queue group `control.<service>` (so of several replicas exactly one answers), decodes and
validates the request, binds it to every log line, runs the handler and sends its reply.
A request that does not validate, or a handler that raises, is answered `error` in one
line; nothing is lost silently. The handler acts through the remediation kernel, which
audits what the request did with the operator's name and reason.

`request()` is the sending side: one request, its typed reply, or `ControlTimeout`
naming the service that did not answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from pydantic import ValidationError

from nodeward.bus.dlq import one_line
from nodeward.bus.errors import BusError
from schemas.cloudevents import one_line as invalid_line
from schemas.control import ControlReply, ControlRequest, control_subject

ControlHandler = Callable[[ControlRequest], Awaitable[ControlReply]]


class ControlTimeout(BusError):
    """No replica of the service answered the request in time."""


def queue_group(service: str) -> str:
    """The queue group every replica of `service` serves its controls in."""
    return f"control.{service}"


async def serve(nc: NATS, service: str, verb: str, handler: ControlHandler) -> Subscription:
    """Answer `control.<service>.<verb>` with `handler` until the connection closes."""
    subject = control_subject(service, verb)
    log = structlog.get_logger().bind(component="control", service=service, verb=verb)

    async def on_request(msg: Msg) -> None:
        reply = await _answer(msg, service, verb, handler, log)
        if not msg.reply:
            log.warning("control.no_reply_subject")
            return
        await nc.publish(
            msg.reply, reply.model_copy(update={"service": service}).model_dump_json().encode()
        )

    sub = await nc.subscribe(subject, queue=queue_group(service), cb=on_request)
    await nc.flush()
    log.info("control.serving", subject=subject)
    return sub


async def _answer(
    msg: Msg,
    service: str,
    verb: str,
    handler: ControlHandler,
    log: structlog.typing.FilteringBoundLogger,
) -> ControlReply:
    try:
        request = ControlRequest.model_validate_json(msg.data)
    except ValidationError as exc:
        log.warning("control.invalid", error=invalid_line(exc))
        return ControlReply.error(f"invalid {verb} request: {invalid_line(exc)}")
    if (request.service, request.verb) != (service, verb):
        return ControlReply.error(
            f"request for {request.service} {request.verb} sent to {control_subject(service, verb)}"
        )
    with structlog.contextvars.bound_contextvars(
        control=verb, operator=request.operator, request_id=request.id, target=request.target
    ):
        try:
            reply = await handler(request)
        except Exception as exc:  # answered: a request is never left without a reply
            log.exception("control.failed")
            what = f"{verb} {request.target}" if request.target else verb
            return ControlReply.error(f"{service} could not {what}: {one_line(exc)}")
        log.info("control.answered", status=reply.status.value, message=reply.message)
        return reply


async def request(nc: NATS, req: ControlRequest, *, timeout: float) -> ControlReply:
    """Send `req` and return the owning service's reply; `ControlTimeout` if none answers."""
    try:
        msg = await nc.request(req.subject, req.model_dump_json().encode(), timeout=timeout)
    except NoRespondersError as exc:
        raise ControlTimeout(
            f"no answer from the {req.service} service on {req.subject} (no replica is "
            "serving it); is it running?"
        ) from exc
    except (NatsTimeout, TimeoutError) as exc:
        raise ControlTimeout(
            f"no answer from the {req.service} service on {req.subject} within {timeout:g}s; "
            "it may still act: its audit record tells (`nodeward tail 'remediation.>'`)"
        ) from exc
    try:
        return ControlReply.model_validate_json(msg.data)
    except ValidationError as exc:
        raise BusError(
            f"the {req.service} service's reply is not a control reply: {invalid_line(exc)}"
        ) from exc
