#!/usr/bin/env python3
"""A TCP proxy on 127.0.0.1 that holds the client-to-server direction to a rate: a slow uplink.

  throttle_proxy.py --port P --target PORT --rate BYTES_PER_SECOND [--hold-answers SECONDS]

Each connection gets its own pair of pumps; the upstream pump sends at most `rate` bytes a
second (in slices of a tenth of a second; 0: no limit), the answer comes back unthrottled but,
with --hold-answers, only that many seconds after it began to arrive. Stopping the process
(SIGKILL) drops every connection, like a link going down.
"""
import argparse, socket, threading, time


def pump(source, sink, rate, hold=0.0):
    try:
        while True:
            budget = max(1, rate // 10) if rate else 1 << 16
            started = time.monotonic()
            data = source.recv(min(budget, 1 << 16))
            if not data:
                break
            if hold:
                time.sleep(hold)
            sink.sendall(data)
            if rate:
                pause = len(data) / rate - (time.monotonic() - started)
                if pause > 0:
                    time.sleep(pause)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(client, target, rate, hold):
    try:
        upstream = socket.create_connection(("127.0.0.1", target))
    except OSError:
        client.close()
        return
    threading.Thread(target=pump, args=(client, upstream, rate), daemon=True).start()
    threading.Thread(target=pump, args=(upstream, client, 0, hold), daemon=True).start()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--target", type=int, required=True)
    parser.add_argument("--rate", type=int, required=True)
    parser.add_argument("--hold-answers", type=float, default=0.0)
    args = parser.parse_args()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    listener.listen(64)
    while True:
        client, _ = listener.accept()
        serve(client, args.target, args.rate, args.hold_answers)


if __name__ == "__main__":
    main()
