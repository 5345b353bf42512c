#!/usr/bin/python3
"""A KV-event publisher that behaves like vLLM's ZmqEventPublisher.

Used by zmqtransport's interop test to check the Go subscriber against libzmq as
driven from Python (Debian's python3-zmq) and payloads packed by
python3-msgpack, independently of the Go encoder.

Wire behaviour mirrored from vllm/distributed/kv_events.py:
  * PUB socket, high-water mark 100000; every batch is the 3-frame message
    [topic, seq (8 bytes, big-endian, from 0), msgpack EventBatch];
  * a ROUTER replay socket: a request [identity, b"", start_seq] is answered
    with every buffered batch whose seq >= start_seq, then an end marker
    whose seq frame is -1 (eight 0xff bytes) with an empty payload; the
    reply layout is [b"", seq, payload] (vLLM < 0.26) or, with
    --replay-layout new, [b"", topic, seq, payload] (vLLM >= 0.26);
  * the replay buffer keeps the last --buffer-steps batches;
  * one thread both publishes and services replay requests.

Payloads are EventBatch [ts, events, dp_rank] with events as tagged arrays
(vLLM 0.10 to 0.23, --shape array) or tagged maps (vLLM >= 0.24,
--shape map). Batch n carries BlockStored(block_hashes=[H(n), n]) with
H(n) = 0x9e3779b97f4a7c15 ^ n, so both full-width and compact msgpack ints
occur, and every tenth batch also a BlockRemoved([n - 5]).

Protocol on stdin/stdout, one line each:
  startup        -> {"pub": endpoint, "replay": endpoint, "seq": last}
  "probe"        -> publish one batch,               {"seq": last}
  "go N [d,d..]" -> publish N batches, dropping the
                    listed seqs on the live socket
                    (they stay in the replay buffer), {"seq": last}
  "restart"      -> a new process on the same ports:
                    fresh sockets, seq 0, empty buffer, {"seq": -1}
  EOF            -> exit
--pre N publishes N batches before the startup line, when nobody listens.
"""

import argparse
import collections
import json
import sys
import time

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def block_hash(n):
    return 0x9E3779B97F4A7C15 ^ n


class Publisher:
    def __init__(self, args):
        self.args = args
        self.topic = args.topic.encode("utf-8")
        self.ctx = zmq.Context()
        self.pub_port = None
        self.replay_port = None
        self.drop = set()
        self.open()

    def open(self):
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.set_hwm(100_000)
        self.replay = self.ctx.socket(zmq.ROUTER)
        self.replay.setsockopt(zmq.LINGER, 0)
        self.replay.setsockopt(zmq.SNDHWM, 0)
        if self.pub_port is None:
            self.pub_port = self.pub.bind_to_random_port("tcp://127.0.0.1")
            self.replay_port = self.replay.bind_to_random_port("tcp://127.0.0.1")
        else:
            bind_retry(self.pub, "tcp://127.0.0.1:%d" % self.pub_port)
            bind_retry(self.replay, "tcp://127.0.0.1:%d" % self.replay_port)
        self.seq = 0
        self.buffer = collections.deque(maxlen=self.args.buffer_steps)

    def close(self):
        self.pub.close(linger=0)
        self.replay.close(linger=0)

    def batch(self, n):
        parent = block_hash(n - 1) if n > 0 else None
        tokens = list(range(n * 32, n * 32 + 32))
        hashes = [block_hash(n), n]
        if self.args.shape == "map":
            events = [{
                "type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
                "token_ids": tokens, "block_size": 16, "lora_id": None, "medium": "GPU",
                "lora_name": None, "extra_keys": [None, None], "group_idx": 0,
                "kv_cache_spec_kind": "full_attention",
            }]
            if n % 10 == 9:
                events.append({"type": "BlockRemoved", "block_hashes": [n - 5], "medium": "GPU", "group_idx": 0})
        else:
            events = [["BlockStored", hashes, parent, tokens, 16, None, "GPU", None, [None, None], 0,
                       "full_attention", None]]
            if n % 10 == 9:
                events.append(["BlockRemoved", [n - 5], "GPU", 0])
        return [time.time(), events, self.args.dp_rank]

    def publish(self):
        seq = self.seq
        self.seq += 1
        payload = msgpack.packb(self.batch(seq), use_bin_type=True)
        if seq not in self.drop:
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        self.buffer.append((seq, payload))
        self.service_replay(0)

    def service_replay(self, timeout_ms):
        while self.replay.poll(timeout_ms):
            timeout_ms = 0
            frame = self.replay.recv_multipart()
            if len(frame) != 3:
                continue
            client_id, _, start_seq_bytes = frame
            start_seq = int.from_bytes(start_seq_bytes, "big")
            new = self.args.replay_layout == "new"
            for seq, buf in self.buffer:
                if seq >= start_seq:
                    if new:
                        self.replay.send_multipart((client_id, b"", self.topic, seq.to_bytes(8, "big"), buf))
                    else:
                        self.replay.send_multipart((client_id, b"", seq.to_bytes(8, "big"), buf))
            if new:
                self.replay.send_multipart((client_id, b"", b"", END_SEQ, b""))
            else:
                self.replay.send_multipart((client_id, b"", END_SEQ, b""))


def bind_retry(sock, endpoint):
    # libzmq releases a closed socket's port asynchronously.
    deadline = time.time() + 10
    while True:
        try:
            sock.bind(endpoint)
            return
        except zmq.ZMQError as e:
            if e.errno != zmq.EADDRINUSE or time.time() > deadline:
                raise
            time.sleep(0.005)


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--topic", default="")
    ap.add_argument("--replay-layout", choices=["old", "new"], default="old")
    ap.add_argument("--shape", choices=["array", "map"], default="array")
    ap.add_argument("--buffer-steps", type=int, default=10_000)
    ap.add_argument("--dp-rank", type=int, default=0)
    ap.add_argument("--pre", type=int, default=0)
    args = ap.parse_args()

    p = Publisher(args)
    for _ in range(args.pre):
        p.publish()
    reply({"pub": "tcp://127.0.0.1:%d" % p.pub_port, "replay": "tcp://127.0.0.1:%d" % p.replay_port,
           "seq": p.seq - 1})

    poller = zmq.Poller()
    poller.register(sys.stdin, zmq.POLLIN)
    while True:
        poller.register(p.replay, zmq.POLLIN)
        ready = dict(poller.poll(100))
        poller.unregister(p.replay)
        if p.replay in ready:
            p.service_replay(0)
        if sys.stdin.fileno() not in ready and sys.stdin not in ready:
            continue
        line = sys.stdin.readline()
        if not line:
            break
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "probe":
            p.publish()
        elif cmd[0] == "go":
            n = int(cmd[1])
            p.drop = {int(s) for s in cmd[2].split(",")} if len(cmd) > 2 else set()
            for _ in range(n):
                p.publish()
        elif cmd[0] == "restart":
            p.close()
            p.drop = set()
            p.open()
        reply({"seq": p.seq - 1})
    p.close()
    p.ctx.term()


if __name__ == "__main__":
    main()
