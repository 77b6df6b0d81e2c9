"""Throttle ``requests``: a session and a mountable transport adapter.

:class:`ThrottledSession` is a ``requests.Session`` whose HTTP and HTTPS
requests wait for their slot's turn (per host by default), count as in flight
until the response body has been read or the response closed, and teach the
slot their latency::

    from autothrottle import Throttle
    from autothrottle.requests import ThrottledSession

    throttle = Throttle(target_concurrency=2.0)
    with ThrottledSession(throttle=throttle) as session:
        response = session.get("https://example.com/")

Or mount :class:`ThrottledHTTPAdapter` on a session of your own, for every
URL or for some prefixes only::

    session = requests.Session()
    adapter = ThrottledHTTPAdapter(throttle=throttle, max_retries=3)
    session.mount("https://", adapter)
    session.mount("http://", adapter)

Threads are first-class: any number of threads may share a session, an
adapter or the throttle (with async clients too); a thread blocks in
``Throttle.acquire_blocking`` while its request waits, and a slot's queue is
FIFO across all of them.

How the adapter behaves (``docs/adapters.md`` has the whole lifecycle):

* **Per-request options**: the keyword ``autothrottle={...}`` on the
  session's methods (keys ``adjust``, ``bypass``, ``slot``, ``max_wait``, as
  in the other adapters), or the header ``X-AutoThrottle: no-adjust | bypass |
  slot=NAME | max-wait=SECONDS``, which works with a mounted adapter on any
  session. The header is removed before the request is sent; malformed
  options raise before anything is sent or held.
* **Latency** is measured from the connection being ready (connected, or
  taken from urllib3's pool), just before the request is written, to
  urllib3 having parsed the response headers. The request takes its wire
  turn at that same moment.
* **In flight** lasts until the body has been read to the end (requests reads
  it before returning unless ``stream=True``) or the response is closed; a
  response dropped unread is released when it is collected, and in any case
  after the throttle's ``hold_timeout``.
* **Errors**: connection errors and timeouts (``requests.ConnectionError``,
  ``requests.Timeout``, ``RetryError``) release the slot and count as the
  host's failure; an invalid URL or header, and an error the request's
  body raised as it was sent (however urllib3 wraps it), only release.
* **Redirects** are followed by the session, which sends each hop through the
  adapter: every hop waits on its own host's slot, with the same options.
* **Retries** by urllib3 (``max_retries``, a number or a ``Retry``): each
  attempt waits for a turn of its own, and each one urllib3 retries is read
  as a response or a failure, once (a ``RetryError`` after the last 503 was
  read is not counted again); urllib3 decides what to retry and how long to
  sleep, as without the throttle.
"""

from __future__ import annotations

import sys
import threading
import warnings
import weakref
from collections.abc import Mapping
from contextvars import ContextVar
from functools import partial
from typing import TYPE_CHECKING, Any, cast

try:
    import requests as _needed  # noqa: F401  (the extra this module needs)
except ImportError as _missing:  # pragma: no cover - depends on the environment
    from ._extras import missing_extra_error

    raise missing_extra_error("autothrottle.requests", "requests", "requests") from _missing

import requests
import requests.adapters
import urllib3
import urllib3.connection
from requests.exceptions import (
    ChunkedEncodingError,
    InvalidHeader,
    InvalidSchema,
    InvalidURL,
    MissingSchema,
    RetryError,
)
from urllib3.poolmanager import ProxyManager
from urllib3.util.retry import Retry

from ._errors import ThrottleTimeout
from ._exchange import Exchange, Plug, ThrottleInfo, paced_blocking
from ._request import (
    CONTROL_HEADER,
    RequestOptions,
    header_value,
    options_from_header,
    options_from_mapping,
)
from ._requests_parts import (
    SENDING,
    Attempts,
    Timing,
    hold_until_finished,
    pool_classes,
    retries_possible,
)
from ._throttle import Throttle, check_throttle, throttle_hint
from ._validate import keywords_only

__all__ = [
    "ThrottleWaitTimeout",
    "ThrottledHTTPAdapter",
    "ThrottledSession",
    "throttle_info",
]

_INFO: weakref.WeakKeyDictionary[requests.Response, ThrottleInfo] = weakref.WeakKeyDictionary()


def throttle_info(response: requests.Response) -> ThrottleInfo | None:
    """What the throttle did to the request of ``response``, or None if it was not throttled.

    Example::

        response = session.get(url)
        if "captcha" in response.text:
            info = throttle_info(response)
            throttle.backoff(url, sent_at=info.sent_at if info else None)
    """
    return _INFO.get(response)


class ThrottleWaitTimeout(ThrottleTimeout, requests.exceptions.Timeout):
    """The wait for the turn outlasted its ``max_wait``: both the library's
    :class:`~autothrottle.ThrottleTimeout` and a ``requests.Timeout`` (so a
    ``requests.RequestException`` handler catches it). Nothing was sent (by
    the attempt that waited: a retry's earlier attempts were).
    """

    def __init__(self, error: ThrottleTimeout, request: requests.PreparedRequest) -> None:
        ThrottleTimeout.__init__(self, error.slot, error.waited, error.bound)
        self.request = request
        self.response = None


_CALLERS_OWN = (InvalidURL, InvalidHeader, InvalidSchema, MissingSchema)


def _host_failure(error: BaseException) -> bool:
    """The host failed: refused, reset, timed out, or kept failing urllib3's retries.

    Every requests exception is an ``OSError``, so the caller's own (an invalid
    URL or header) are told apart first. urllib3's ``EmptyPoolError`` (a
    blocking pool's ``pool_timeout`` passed) says the caller's own pool had no
    connection to give: the host was never asked.
    """
    if isinstance(error, _CALLERS_OWN):
        return False
    if isinstance(error, urllib3.exceptions.EmptyPoolError):
        return False
    if isinstance(error, requests.RequestException):
        return isinstance(
            error,
            (requests.ConnectionError, requests.Timeout, RetryError, ChunkedEncodingError),
        )
    return isinstance(error, (OSError, urllib3.exceptions.HTTPError))


def _unconnected(error: BaseException) -> bool:
    """The host's failure was a connection never made: urllib3 could not connect
    (refused, a name not found: a ``NewConnectionError``) or timed out
    connecting (``ConnectTimeout``), through a proxy too. urllib3's own error
    is read as well: an attempt it retried is known by that (its ``Retry``'s
    history), never wrapped by requests."""
    if isinstance(error, requests.ConnectTimeout):
        return True
    if isinstance(error, urllib3.exceptions.HTTPError):
        reason: object = error
    elif isinstance(error, requests.ConnectionError) and error.args:
        reason = error.args[0]
    else:
        return False
    if isinstance(reason, urllib3.exceptions.MaxRetryError):
        reason = reason.reason
    if isinstance(reason, urllib3.exceptions.ProxyError):
        reason = reason.original_error
    return isinstance(
        reason, (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError)
    )


# -- the adapter ----------------------------------------------------------------------


class _RetriesSetter:
    """``ThrottledHTTPAdapter.max_retries``: kept in the adapter's ``__dict__``, as
    requests keeps it, and read from there (a descriptor with no ``__get__``:
    requests reads it for every request, which pays no call for it). Set, the
    adapter learns whether urllib3 may retry (``_requests_parts.Attempts``),
    and pools made before (``max_retries`` assigned after the adapter was
    made) are let go, as ``close()`` does, to be made anew of that kind."""

    def __set__(self, adapter: ThrottledHTTPAdapter, retries: Retry) -> None:
        adapter.__dict__["max_retries"] = retries
        adapter._retries_set(retries)  # noqa: SLF001 (the adapter's own step)


def _prepare(
    throttle: Throttle, request: requests.PreparedRequest
) -> tuple[requests.PreparedRequest, str | None, RequestOptions]:
    """The request to send, its slot key (None: do not throttle it) and its options.

    With the control header, a copy without it is sent: the session builds
    redirect hops from the original, and they must carry the same options.
    """
    options = RequestOptions()
    send = request
    header = request.headers.get(CONTROL_HEADER)
    if header is not None:
        options = options_from_header(header)
        send = request.copy()
        del send.headers[CONTROL_HEADER]
    if options.bypass:
        return send, None, options
    if options.slot is not None:
        return send, options.slot, options
    host = urllib3.util.parse_url(request.url or "").host
    if not host:
        return send, None, options
    return send, throttle.key_for(request.url, host=host), options


@keywords_only(throttle_hint)
class ThrottledHTTPAdapter(requests.adapters.HTTPAdapter):
    """A ``requests`` transport adapter that paces its requests with ``throttle``.

    It is requests' own ``HTTPAdapter`` (same arguments, same connection
    pools, proxies and retries) with every request sent through the throttle.
    Mount it for the prefixes to throttle; :class:`ThrottledSession` mounts it
    for ``http://`` and ``https://``.

    Args:
        throttle: The engine; it may be shared with other adapters, sessions,
            threads and async clients, which then share its slots.
        **kwargs: ``pool_connections``, ``pool_maxsize``, ``max_retries`` and
            ``pool_block``, as for ``requests.adapters.HTTPAdapter``.

    Raises:
        TypeError: ``throttle`` is not a :class:`~autothrottle.Throttle`.

    With a ``max_retries`` that lets urllib3 retry, every attempt it makes
    waits for a turn of its own (paced, under the cap, FIFO with other
    threads) and every attempt it retries reaches the throttle as a response
    or failure would (a retried 429 backs the slot off and its
    ``Retry-After`` is heard before urllib3 sleeps), while urllib3 drives its
    ``Retry`` as ever: ``ThrottledHTTPAdapter(throttle=throttle,
    max_retries=Retry(total=5, status_forcelist=[429, 503]))``.
    SOCKS proxies use urllib3's own connections: their requests are paced,
    and their latency runs from the turn to the headers.

    Example::

        session = requests.Session()
        session.mount("https://api.example.com/", ThrottledHTTPAdapter(throttle=throttle))
    """

    def __init__(self, *, throttle: Throttle, **kwargs: Any) -> None:
        self._throttle = check_throttle(throttle, type(self).__name__)
        super().__init__(**kwargs)

    if TYPE_CHECKING:
        max_retries: Retry
    else:
        max_retries = _RetriesSetter()

    def _retries_set(self, retries: Retry) -> None:
        self._retried = retries_possible(retries)
        if "poolmanager" in vars(self):  # set after requests' __init__ made the pools
            self.close()
            self.poolmanager.pool_classes_by_scheme = self._pool_classes()
            for manager in self.proxy_manager.values():
                if type(manager) is ProxyManager:
                    manager.pool_classes_by_scheme = self._pool_classes()

    def _pool_classes(self) -> dict[str, type[urllib3.HTTPConnectionPool]]:
        return pool_classes(block=self._pool_block, retries=self._retried)

    @property
    def throttle(self) -> Throttle:
        """The throttle that paces this adapter's requests."""
        return self._throttle

    def __repr__(self) -> str:
        return f"ThrottledHTTPAdapter(throttle={self._throttle!r})"

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = pool_classes(block=block, retries=self._retried)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if type(manager) is ProxyManager:  # not SOCKS, whose pools are its own
            manager.pool_classes_by_scheme = self._pool_classes()
        return manager

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        """Block for the slot's turn, send, observe the response and hold the slot
        until its body is finished."""
        send, key, options = _prepare(self._throttle, request)
        kwargs: dict[str, Any] = {
            "stream": stream,
            "timeout": timeout,
            "verify": verify,
            "cert": cert,
            "proxies": proxies,
        }
        if key is None:
            return super().send(send, **kwargs)
        hooks = request.hooks  # a plain session's, guarded (_guard_hooks); none: no call
        guarded = bool(hooks and hooks.get("response")) and _sent_by_session(self)
        if self._retried:
            attempts = Attempts(self._throttle, key, options, _PLUG)
            sender = partial(self._send_attempts, attempts, kwargs)
        else:
            sender = partial(super().send, **kwargs)
        response = paced_blocking(
            _PLUG, self._throttle, key, options, options.max_wait, sender, send
        )
        if guarded and _ANSWERED.get() is None:  # not under ThrottledSession.send
            _guard_hooks(hooks, response)
        return response

    def _send_attempts(
        self, attempts: Attempts, kwargs: dict[str, Any], request: requests.PreparedRequest
    ) -> requests.Response:
        """Send a request urllib3 may retry, each attempt on a turn of its own
        (``_requests_parts.Attempts``)."""
        timing = SENDING.get()
        assert timing is not None  # wired just before (paced_blocking)
        timing.attempts = attempts
        try:
            return super().send(request, **kwargs)
        except requests.ConnectionError as error:
            # A retry's turn outlasted max_wait (requests wraps every OSError).
            turn = error.args[0] if error.args else None
            if isinstance(turn, ThrottleWaitTimeout):
                raise turn from None
            if isinstance(turn, ThrottleTimeout):
                raise _PLUG.timed_out(turn, request) from None
            raise


class _RequestsPlug(Plug[requests.PreparedRequest, requests.Response, Timing]):
    """How requests sends and reads, for the request skeleton (``_exchange.paced_blocking``)."""

    __slots__ = ()

    def host_failure(self, error: BaseException) -> bool:
        # The request's body raised as it was sent (the wiring is still in place),
        # or its last attempt was read already (urllib3 gave up on a response it
        # drained, or the turn for its next attempt did not come).
        timing = SENDING.get()
        if timing is not None and (getattr(timing, "body_raised", False) or _settled(timing)):
            return False
        return _host_failure(error)

    def unconnected(self, error: BaseException) -> bool:
        timing = SENDING.get()
        if timing is not None and _settled(timing):
            return False
        return _unconnected(error)

    def timed_out(self, error: ThrottleTimeout, request: requests.PreparedRequest) -> BaseException:
        return ThrottleWaitTimeout(error, request)

    def wire(self, exchange: Exchange, request: requests.PreparedRequest) -> Timing:
        # urllib3's connection finds it there, on this same thread.
        timing = Timing(exchange)
        timing.token = SENDING.set(timing)
        return timing

    def unwire(self, request: requests.PreparedRequest, wiring: Timing) -> None:
        SENDING.reset(wiring.token)

    def respond(
        self, exchange: Exchange, response: requests.Response, wiring: Timing
    ) -> requests.Response:
        exchange.responded(
            response.status_code,
            response.headers,
            wiring.end,
            from_cache=getattr(response, "from_cache", False) is True,
        )
        _INFO[response] = exchange.info()
        hold_until_finished(response.raw, exchange.lease)
        answered = _ANSWERED.get()
        if answered is not None:
            answered.append(response)
        return response

    def close(self, response: requests.Response) -> None:
        response.close()


def _settled(timing: Timing) -> bool:
    attempts: Attempts | None = getattr(timing, "attempts", None)
    return attempts is not None and attempts.settled


_PLUG = _RequestsPlug()

_ANSWERED: ContextVar[list[requests.Response] | None] = ContextVar(
    "autothrottle_requests_answered", default=None
)
"""The responses the adapter answered within :meth:`ThrottledSession.send` on
this thread (each hop of a redirect has a ``send`` of its own)."""


def _finish_unreturned(
    answered: list[requests.Response], error: BaseException, stream: bool
) -> None:
    """``Session.send`` raised ``error`` after the adapter answered: hand the slots back.

    requests runs the response hooks after the adapter returned, and reads
    the body after them: a hook that raised left the response unread, held by
    nothing but the error's traceback, and an error kept (a thread pool's
    future keeps it) held the slot until ``hold_timeout``. A response the
    caller never gets is closed. One the error carries (``raise_for_status``
    as a hook: ``HTTPError.response``) is the caller's: its body is read, as
    requests would have read it before returning, unless it was streamed (a
    stream is the caller's to read or close, as ever) or the error is an
    interrupt (nothing more is read after one: closed).
    """
    carried = getattr(error, "response", None)
    for response in answered:
        if response is carried and isinstance(error, Exception):
            if stream:
                continue
            try:
                response.content  # noqa: B018 (read, so the hold is finished)
                continue
            except Exception:  # unreadable: closed below, the error raised is the hook's
                pass
        response.close()


def _guard_hooks(hooks: dict[str, Any], response: requests.Response) -> None:
    """A plain ``requests.Session`` will run ``response``'s hooks (``hooks``, its
    request's, with response hooks in it): guard them.

    ``Session.send`` dispatches the response hooks of the request's ``hooks``
    dict after the adapter returned, and a hook that raised left the response
    unread and held (:func:`_finish_unreturned` says why). The dict's
    ``"response"`` entry is swapped for a :class:`_HookGuard` until the
    responses it guards are dispatched; then the caller's own entry (the same
    list, never changed) is put back, before any hook runs: a hook, and the
    caller after ``send``, see their hooks as they were.

    One dict may be dispatched by several threads at once (one
    ``PreparedRequest`` sent twice; a redirect's or an auth's copy shares its
    dict): they share one guard, which knows each dispatch by the response it
    is given, so a hook that raises in one thread finishes that thread's
    response only. Only ``Session.send`` is given a guard (the adapter's
    ``send`` checks its caller, :func:`_sent_by_session`): a ``send`` called
    by hand, as an auth's hook resends a request, has no dispatch to come,
    and a guard would stay.

    The guard holds its responses weakly: an interrupt that lands between
    the adapter's return and the dispatch (in ``Session.send``, where no code
    of ours runs) leaves the guard waiting for a dispatch that never comes,
    and a strong reference from the request's hooks dict would hold the
    response, and its slot, as long as the request lives (until
    ``hold_timeout``). Held weakly, the response is collected when the
    error is let go, which releases its slot, and the guard puts the
    caller's entry back then (:meth:`_HookGuard.collected`).
    """
    with _GUARDING:
        entry = hooks.get("response")
        guard = _HookGuard.installed(hooks, entry)
        if guard is None:
            guard = _HookGuard(hooks, entry)
            hooks["response"] = guard.entry
        key = id(response)
        guard.pending[key] = weakref.ref(response, partial(guard.collected, key))


_GUARDING = threading.Lock()
"""Held while a hooks dict's guard is installed, given a response or put back."""

_SESSIONS_FILE = requests.sessions.__file__


def _sent_by_session(adapter: ThrottledHTTPAdapter) -> bool:
    """Whether the adapter's ``send`` that called this was called by requests' own
    ``Session.send`` (a plain session's, or a subclass's through ``super()``;
    through a subclass's ``send`` of the adapter too), which dispatches the
    request's hooks once it returns.

    Why the caller's frame: nothing else tells the two apart. requests calls
    the adapter with the same arguments from ``Session.send``, which will
    dispatch the hooks, and from an auth's hook or any code sending by hand,
    which will not (a guard installed then would stay in the caller's hooks
    dict). A marker on the response cannot help: the guard must be in the
    dict before requests reads it, and a hook appended to run last cannot
    see that a hook before it raised. requests' ``send`` is known by its
    code's qualified name and file, not by the function object, so that an
    instrumentation wrapping ``Session.send`` (before this module was
    imported, or after) changes nothing. A caller not known so is given no
    guard: a hook that raises then leaves its response held as without the
    guard, until it is collected (or ``hold_timeout``)."""
    frame = sys._getframe(2)  # noqa: SLF001 (the stdlib's, documented, no other way)
    while frame.f_code.co_name == "send" and frame.f_locals.get("self") is adapter:
        if frame.f_back is None:
            return False
        frame = frame.f_back
    code = frame.f_code
    return code.co_qualname == "Session.send" and code.co_filename == _SESSIONS_FILE


class _HookGuard:
    """The caller's response hooks, run as requests runs them (each given what
    the one before returned, unless None), and :func:`_finish_unreturned` for
    the response they were dispatched for if one raises."""

    __slots__ = ("caller", "entry", "hooks", "pending")

    def __init__(self, hooks: dict[str, Any], caller: Any) -> None:
        self.hooks = hooks
        self.caller = caller
        self.entry = [self]
        #: The responses answered and not yet dispatched, by id, held weakly.
        self.pending: dict[int, weakref.ref[requests.Response]] = {}

    @staticmethod
    def installed(hooks: dict[str, Any], entry: Any) -> _HookGuard | None:
        if type(entry) is list and len(entry) == 1:
            guard = entry[0]
            if type(guard) is _HookGuard and guard.entry is entry and guard.hooks is hooks:
                return guard
        return None

    def collected(self, key: int, ref: weakref.ref[requests.Response]) -> None:
        """A response given to the guard was collected undispatched (an interrupt
        before requests' dispatch, its error let go): forget it, and put the
        caller's entry back if it was the last. Skipped when another step of
        a guard holds the lock (this very thread's, when the collection runs
        inside it): the next dispatch of the dict forgets it then."""
        if not _GUARDING.acquire(blocking=False):
            return
        try:
            if self.pending.get(key) is ref:
                del self.pending[key]
            self._put_back()
        finally:
            _GUARDING.release()

    def _put_back(self) -> None:
        """Put the caller's entry back if no response it guards is alive (the
        dead are forgotten); with :data:`_GUARDING` held."""
        pending = self.pending
        for key in [key for key, ref in pending.items() if ref() is None]:
            del pending[key]
        if not pending and self.hooks.get("response") is self.entry:
            self.hooks["response"] = self.caller

    def __call__(self, response: requests.Response, **kwargs: Any) -> requests.Response:
        with _GUARDING:
            ref = self.pending.pop(id(response), None)
            ours = None if ref is None else ref()
            if ours is not response:  # not one it guards (a stale id's entry is put back)
                if ours is not None:
                    self.pending[id(response)] = cast("weakref.ref[requests.Response]", ref)
                ours = None
            self._put_back()
        caller = self.caller
        try:
            for hook in [caller] if callable(caller) else caller:
                returned = hook(response, **kwargs)
                if returned is not None:
                    response = returned
        except BaseException as error:
            if ours is not None:
                _finish_unreturned([ours], error, bool(kwargs.get("stream")))
            raise
        return response


# -- the session ----------------------------------------------------------------------


#: ``requests.Session.request``'s parameters after ``method`` and ``url``, in order.
_REQUEST_PARAMETERS = (
    "params",
    "data",
    "headers",
    "cookies",
    "files",
    "auth",
    "timeout",
    "allow_redirects",
    "proxies",
    "hooks",
    "stream",
    "verify",
    "cert",
    "json",
)


def _with_options(kwargs: dict[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` whose headers carry ``options`` as the control header."""
    parsed = options_from_mapping({"autothrottle": options})
    value = header_value(parsed)
    if not value:
        return kwargs
    headers = dict(kwargs.get("headers") or {})
    for name in list(headers):
        if isinstance(name, str) and name.lower() == CONTROL_HEADER.lower():
            value = f"{headers.pop(name)}, {value}"
    headers[CONTROL_HEADER] = value
    return {**kwargs, "headers": headers}


@keywords_only(throttle_hint)
class ThrottledSession(requests.Session):
    """A ``requests.Session`` whose HTTP and HTTPS requests are throttled.

    It mounts a :class:`ThrottledHTTPAdapter` for ``http://`` and ``https://``
    (built with ``adapter_options``, e.g. ``max_retries``). Every method takes
    one more keyword, ``autothrottle``: the per-request options
    (``{"adjust": False}``, ``{"bypass": True}``, ``{"slot": "name"}``,
    ``{"max_wait": 2.0}``), carried to the adapter in the control header::

        with ThrottledSession(throttle=throttle) as session:
            session.get("https://example.com/a")
            session.get("https://example.com/health", autothrottle={"bypass": True})

    An adapter mounted later that is not a :class:`ThrottledHTTPAdapter`
    sends its requests unthrottled; mounting a plain ``HTTPAdapter`` warns.
    Compose a caching adapter by subclassing both, the cache first, so hits
    never wait: ``class Cached(CacheControlAdapter, ThrottledHTTPAdapter)``.

    Args:
        throttle: The engine that paces the requests.
        **adapter_options: Passed to both adapters.
    """

    def __init__(self, *, throttle: Throttle, **adapter_options: Any) -> None:
        check_throttle(throttle, type(self).__name__)
        super().__init__()  # mounts requests' own adapters, replaced below
        self._throttle = throttle
        self.mount("https://", ThrottledHTTPAdapter(throttle=throttle, **adapter_options))
        self.mount("http://", ThrottledHTTPAdapter(throttle=throttle, **adapter_options))

    @property
    def throttle(self) -> Throttle:
        """The throttle that paces this session's requests."""
        return self._throttle

    def mount(self, prefix: str, adapter: requests.adapters.BaseAdapter) -> None:
        if (
            hasattr(self, "_throttle")
            and isinstance(adapter, requests.adapters.HTTPAdapter)
            and not isinstance(adapter, ThrottledHTTPAdapter)
        ):
            warnings.warn(
                f"{type(adapter).__name__} mounted at {prefix!r} on a ThrottledSession is "
                "not throttled; mount a ThrottledHTTPAdapter (same arguments) instead",
                stacklevel=2,
            )
        super().mount(prefix, adapter)

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        """``requests.Session.send``; a response it answered but did not return
        (a response hook raised) is finished, its slot handed back."""
        answered: list[requests.Response] = []
        token = _ANSWERED.set(answered)
        try:
            return super().send(request, **kwargs)
        except BaseException as error:
            _finish_unreturned(answered, error, bool(kwargs.get("stream")))
            raise
        finally:
            _ANSWERED.reset(token)

    def request(
        self,
        method: str,
        url: Any,
        *args: Any,
        autothrottle: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> requests.Response:
        """``requests.Session.request``, plus the ``autothrottle`` options."""
        if autothrottle is not None:
            named = dict(zip(_REQUEST_PARAMETERS, args, strict=False))
            if named.keys() & kwargs.keys():
                raise TypeError(
                    f"request() got multiple values for {sorted(named.keys() & kwargs.keys())}"
                )
            kwargs = _with_options({**named, **kwargs}, autothrottle)
            args = ()
        return super().request(method, url, *args, **kwargs)

    def get(self, url: Any, params: Any = None, **kwargs: Any) -> requests.Response:
        return self.request("GET", url, params=params, **kwargs)

    def options(self, url: Any, **kwargs: Any) -> requests.Response:
        return self.request("OPTIONS", url, **kwargs)

    def head(self, url: Any, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("allow_redirects", False)
        return self.request("HEAD", url, **kwargs)

    def post(
        self, url: Any, data: Any = None, json: Any = None, **kwargs: Any
    ) -> requests.Response:
        return self.request("POST", url, data=data, json=json, **kwargs)

    def put(self, url: Any, data: Any = None, **kwargs: Any) -> requests.Response:
        return self.request("PUT", url, data=data, **kwargs)

    def patch(self, url: Any, data: Any = None, **kwargs: Any) -> requests.Response:
        return self.request("PATCH", url, data=data, **kwargs)

    def delete(self, url: Any, **kwargs: Any) -> requests.Response:
        return self.request("DELETE", url, **kwargs)
