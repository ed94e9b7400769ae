"""A push whose replies are lost is retried and applied once, however many
requests it made to one shard. psd recognises a retry by its request id, among
a worker's last 512 (server/request_log.h); the client keeps at most 256 such
requests in flight per shard, so none it may retry has been forgotten. Before,
a push of 513 requests whose replies were lost was applied twice, whole."""
import asyncio
import threading

import numpy as np

import psclient

PARTS = 600  # requests in one push to one shard: more than psd's window of 512 ids
FLOATS = 1024  # per request, with part_bytes = max_request_bytes = 4096


class ReplyDroppingProxy:
    """A loopback TCP proxy to psd. Once armed, it holds back psd's next reply
    bytes for `hold` seconds, then cuts both sides: psd has applied what it
    answered, and the client sees its connection break with the replies lost."""

    def __init__(self, target_port, hold=1.0):
        self.target_port, self.hold = target_port, hold
        self.armed = threading.Event()
        self.cuts = 0
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(10), "proxy did not start"

    def _run(self, started):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    async def _serve(self, client_r, client_w):
        psd_r, psd_w = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pipe(src, dst, from_psd):
            while data := await src.read(1 << 16):
                if from_psd and self.armed.is_set():
                    self.armed.clear()
                    await asyncio.sleep(self.hold)
                    self.cuts += 1
                    return
                dst.write(data)
                await dst.drain()

        ways = [asyncio.ensure_future(pipe(client_r, psd_w, False)), asyncio.ensure_future(pipe(psd_r, client_w, True))]
        await asyncio.wait(ways, return_when=asyncio.FIRST_COMPLETED)
        for w in ways:
            w.cancel()
        for w in (client_w, psd_w):
            w.transport.abort()

    def close(self):
        async def shut():
            self.server.close()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in others:
                t.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_a_push_of_more_requests_than_psds_window_is_applied_once_after_lost_replies(psd):
    proxy = ReplyDroppingProxy(psd.port)
    try:
        with psclient.Client(f"127.0.0.1:{proxy.port}", worker_index=0, part_bytes=4 * FLOATS,
                             max_request_bytes=4 * FLOATS, prefer_unix_socket=False,
                             reconnect_timeout=30) as c:
            c.create([psclient.TensorSpec("w", (PARTS * FLOATS,), optimizer=psclient.sgd(1.0))])
            c.create_tables([psclient.TableSpec("t", FLOATS - 4, rows=PARTS,
                                                optimizer=psclient.RowOptimizerConfig.sgd(1.0))])
            c.pull("w")  # connected and warm before the proxy is armed

            proxy.armed.set()
            c.push("w", np.full(PARTS * FLOATS, -1.0, dtype=np.float32))
            assert proxy.cuts == 1  # the replies were lost and the push retried
            w = c.pull("w")
            assert np.count_nonzero(w == 2.0) == 0, "parts applied twice"
            np.testing.assert_array_equal(w, np.ones(PARTS * FLOATS, dtype=np.float32))

            ids = np.arange(PARTS, dtype=np.int64)
            proxy.armed.set()
            c.push_rows("t", ids, np.full((PARTS, FLOATS - 4), -1.0, dtype=np.float32))
            assert proxy.cuts == 2
            rows = np.zeros((PARTS, FLOATS - 4), dtype=np.float32)
            c.pull_rows("t", ids, rows)
            assert np.count_nonzero(rows == 2.0) == 0, "rows applied twice"
            np.testing.assert_array_equal(rows, np.ones_like(rows))
    finally:
        proxy.close()


def test_pushes_given_up_midway_leave_no_turn_taken(psd):
    # A push given up (call_timeout) with requests in flight and others
    # queued behind them hands every turn on: later pushes still go out.
    import signal
    import time

    with psclient.Client(psd.address, worker_index=0, part_bytes=4 * FLOATS, max_request_bytes=4 * FLOATS,
                         prefer_unix_socket=False, call_timeout=1.0, connect_timeout=1.0) as c:
        c.create([psclient.TensorSpec("w", (PARTS * FLOATS,), optimizer=psclient.sgd(1.0))])
        grad = np.full(PARTS * FLOATS, -1.0, dtype=np.float32)
        for _ in range(3):
            psd.proc.send_signal(signal.SIGSTOP)
            try:
                start = time.monotonic()
                try:
                    c.push("w", grad)
                    raise AssertionError("a push to a stopped psd returned")
                except psclient.Error:
                    pass
                assert time.monotonic() - start < 10
            finally:
                psd.proc.send_signal(signal.SIGCONT)
        time.sleep(1)  # what the given-up pushes left in psd's sockets is applied by now
        before = c.pull("w")
        c.push("w", grad)
        np.testing.assert_array_equal(c.pull("w"), before + 1.0)
