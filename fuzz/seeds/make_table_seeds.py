#!/usr/bin/env python3
"""Writes seed inputs for fuzz/shard_fuzz (fuzz/seeds/shard) and fuzz/rpc_fuzz
(fuzz/seeds/rpc) that call the table methods on the tables the targets start
with, so that a short run reaches past the message parsing. Needs the capnp
tool. Run from the repository root: python3 fuzz/seeds/make_table_seeds.py

A shard_fuzz input is an operation byte, a caller byte and a message; an
rpc_fuzz input is read by FuzzedDataProvider: the messages from the front,
each call's length and method number from the back, the hello byte last.
"""
import os, struct, subprocess, tempfile

# The parameter structs of the methods, laid out as schema/ps.capnp's.
MIRROR = """@0xd1c0a3b2e4f50617;
using Ps = import "/schema/ps.capnp";
struct PullRows { table @0 :Text; ids @1 :List(UInt64); minStep @2 :Int64; into @3 :Ps.SharedSlice; lookup @4 :Bool; }
struct PushRows { table @0 :Text; ids @1 :List(UInt64); grads @2 :Data; step @3 :Int64; requestId @4 :UInt64; doneStep @5 :Int64 = -1; sharedGrads @6 :Ps.SharedSlice; idsDistinct @7 :Bool; parts @8 :UInt32 = 1; }
struct RestoreRows { table @0 :Text; ids @1 :List(UInt64); values @2 :Data; slots @3 :List(Data); version @4 :UInt64; ages @5 :List(UInt32); }
struct CreateTables { tables @0 :List(Ps.TableSpec); validateOnly @1 :Bool; }
struct Empty {}
"""
ROOT = os.getcwd()
TMP = tempfile.mkdtemp()
open(os.path.join(TMP, 'mirror.capnp'), 'w').write(MIRROR)

def enc(typ, text):
    return subprocess.run(['capnp', 'encode', '-I/usr/include', '-I' + ROOT, os.path.join(TMP, 'mirror.capnp'), typ],
                          input=text.encode(), capture_output=True, check=True).stdout
def f32(*xs):
    return '0x"' + ' '.join(struct.pack('<f', x).hex() for x in xs) + '"'
msgs = {
 'pull_emb': ('PullRows', '(table = "emb", ids = [0, 3, 3, 15], minStep = 0)'),
 'pull_dyn': ('PullRows', '(table = "dyn", ids = [7, 18446744073709551615, 42], minStep = 0)'),
 # Reads without creating: ids the table does not hold read as initial values.
 'lookup_dyn': ('PullRows', '(table = "dyn", ids = [7, 99, 18446744073709551614], lookup = true)'),
 'push_emb': ('PushRows', '(table = "emb", ids = [1, 3, 3], grads = %s, step = 0, requestId = 9)' % f32(*([0.5]*12))),
 'push_dyn': ('PushRows', '(table = "dyn", ids = [5, 6], grads = %s, step = 0, requestId = 11, doneStep = 0)' % f32(1, -1, 2, -2)),
 'push_hot': ('PushRows', '(table = "hot", ids = [2], grads = %s)' % f32(-3.0, 3.0)),
 # shard_fuzz's "exp": admitted at the second push, expired a step later; each push ends a step.
 'push_exp': ('PushRows', '(table = "exp", ids = [5, 6, 5], grads = %s, step = 0, requestId = 15, doneStep = 0)' % f32(1, -1, 2, -2, 0.5, 0.5)),
 'pull_exp': ('PullRows', '(table = "exp", ids = [5, 9, 6], minStep = 0)'),
 # Says its ids are distinct and repeats one (psd may take its word).
 'push_lie': ('PushRows', '(table = "emb", ids = [2, 4, 2], grads = %s, requestId = 13, idsDistinct = true)' % f32(*([0.25]*12))),
 # Rows of "exp" with their ages (one past its expiry), and a push in parts (refused in sync mode).
 'restore_exp': ('RestoreRows', '(table = "exp", ids = [5, 7], values = %s, slots = [%s], version = 2, ages = [0, 9])' % (f32(1, 2, 3, 4), f32(0.5, 0.5, 0.5, 0.5))),
 'push_parts': ('PushRows', '(table = "emb", ids = [1], grads = %s, step = 0, requestId = 17, parts = 2)' % f32(1, 1, 1, 1)),
 'restore_emb': ('RestoreRows', '(table = "emb", ids = [4, 5], values = %s, slots = [%s], version = 3)' % (f32(*([1.0]*8)), f32(*([0.2]*8)))),
 'create_tables': ('CreateTables', '(tables = [(name = "new", dim = 3, rows = 10, optimizer = (kind = lazyAdam, learningRate = 0.1), numShards = 1), (name = "d2", dim = 2, dynamic = true, placement = hash, rowLimit = 4, onLimit = evictLru, numShards = 1, expireAfterSteps = 2)], validateOnly = false)'),
 'list': ('Empty', '()'),
}
bins = {k: enc(t, x) for k, (t, x) in msgs.items()}
ops = {'create_tables': 8, 'pull_emb': 9, 'pull_dyn': 9, 'lookup_dyn': 9, 'pull_exp': 9, 'push_emb': 10, 'push_dyn': 10,
       'push_hot': 10, 'push_lie': 10, 'push_exp': 10, 'push_parts': 10, 'restore_emb': 11, 'restore_exp': 11,
       'list': 12}
SHARD = 'fuzz/seeds/shard'
os.makedirs(SHARD, exist_ok=True)
for k, b in bins.items():
    for who in (1, 0x81):  # worker 0, async and sync
        open(os.path.join(SHARD, '%s_%02x' % (k, who)), 'wb').write(bytes([ops[k], who]) + b)
# rpc_fuzz: [msgs...][per call from the back: low, high, method][hello]
methods = {'create_tables': 15, 'pull_emb': 16, 'pull_dyn': 16, 'lookup_dyn': 16, 'pull_exp': 16, 'push_emb': 17,
           'push_dyn': 17, 'push_hot': 17, 'push_lie': 17, 'push_exp': 17, 'push_parts': 17, 'list': 18,
           'restore_emb': 19, 'restore_exp': 19}
RPC = 'fuzz/seeds/rpc'
os.makedirs(RPC, exist_ok=True)
def rpc(calls, hello):
    front = b''.join(bins[c] for c in calls)
    back = b''
    for c in calls:  # the first call's integers are consumed first, from the very end
        n = len(bins[c])
        back = bytes([n & 0xff, n >> 8, methods[c]]) + back
    return front + back + bytes([hello])
open(os.path.join(RPC, 'tables_worker'), 'wb').write(rpc(['pull_emb', 'push_emb', 'push_dyn', 'pull_dyn', 'lookup_dyn', 'restore_emb', 'list', 'create_tables', 'push_hot', 'push_lie', 'push_parts', 'restore_exp'], 0x07))
open(os.path.join(RPC, 'tables_tool'), 'wb').write(rpc(['list', 'pull_emb', 'restore_emb', 'create_tables'], 0x01))
print(len(os.listdir(SHARD)), 'shard_fuzz seeds,', len(os.listdir(RPC)), 'rpc_fuzz seeds')
