#!/usr/bin/env python3
"""Recomputes the test vectors of docs/PROTOCOL.md §8 from the text of the spec alone, with
python3 and two packages that share no code with the Rust implementation: `blake3` (key
derivation, keyed PRFs, macs) and `cryptography` (OpenSSL's X25519, AES-256 and the AEADs).
BLAKE2s and HMAC come from the standard library; the Noise handshake is written out below
from the Noise specification (rev. 34), not taken from any Noise library.

    python3 -m venv v && v/bin/pip install blake3 cryptography
    v/bin/python3 scripts/check-vectors.py

Prints each value and exits non-zero if any differs from the value §8 lists.
"""

import hashlib
import hmac
import ipaddress
import struct
import sys

from blake3 import blake3
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

FAILED = []


def check(name, got, want):
    ok = got == want
    print(("ok   " if ok else "FAIL ") + name + ": " + str(got))
    if not ok:
        print("     want " + str(want))
        FAILED.append(name)


def dk(context, material):
    return blake3(material, derive_key_context=context).digest()


def keyed(key, data, n):
    return blake3(data, key=key).digest()[:n]


def ip(s):
    return ipaddress.IPv6Address(s).packed


def ipstr(b):
    return str(ipaddress.IPv6Address(b))


EPOCH = 170_000_000
LOW, HIGH = "2001:db8:a::1", "2001:db8:b::2"
K = bytes(range(32))

# ---- §2.2, §2.4, §2.5: keyed addresses, attempts, ports ----


def keyed_iid(key, role, true, epoch, attempt):
    ak = dk("mt6d-proto 2025-01-01 hashed address key", key)
    return keyed(ak, bytes([role]) + ip(true)[8:] + struct.pack(">Q", epoch) + bytes([attempt]), 8)


def is_reserved(iid):
    v = int.from_bytes(iid, "big")
    return (v == 0 or 0x02005EFFFE000000 <= v <= 0x02005EFFFEFFFFFF
            or 0xFDFFFFFFFFFFFF80 <= v <= 0xFDFFFFFFFFFFFFFF)


def search(iid_of, prefix, offset, taken=None):
    for i in range(256):
        a = (offset + i) % 256
        iid = iid_of(a)
        addr = prefix[:8] + iid
        if not is_reserved(iid) and addr != taken:
            return addr, a
    iid = bytearray(iid_of(offset))
    if is_reserved(iid):
        iid[0] ^= 1
    return prefix[:8] + bytes(iid), offset


def port(key, role, true, epoch, k):
    pk = dk("mt6d-proto 2025-01-01 port hopping key", key)
    data = bytes([role]) + ip(true)[8:] + struct.pack(">Q", epoch) + (bytes([k]) if k else b"")
    return 1024 + int.from_bytes(keyed(pk, data, 8), "big") % 64512


def route(key, epoch, k=0, thesis=False):
    """Role 0's route: (local addr, local port, remote addr, remote port). Thesis derivation
    (§2.1) changes the addresses only; ports always come from the keyed PRF (§2.5)."""
    if thesis:
        a, _ = search(lambda t: thesis_iid(LOW, epoch, t, key), ip(LOW), k)
        b, _ = search(lambda t: thesis_iid(HIGH, epoch, t, key), ip(HIGH), k, taken=a)
    else:
        a, _ = search(lambda t: keyed_iid(key, 0, LOW, epoch, t), ip(LOW), k)
        b, _ = search(lambda t: keyed_iid(key, 1, HIGH, epoch, t), ip(HIGH), k, taken=a)
    return a, port(key, 0, LOW, epoch, k), b, port(key, 1, HIGH, epoch, k)


def sock(addr, p):
    return "[%s]:%d" % (ipstr(addr), p)


check("reserved-range bounds",
      [is_reserved(v.to_bytes(8, "big")) for v in (
          0, 0x02005EFFFE000000, 0x02005EFFFEFFFFFF, 0xFDFFFFFFFFFFFF80, 0xFDFFFFFFFFFFFFFF,
          1, 0x02005EFFFDFFFFFF, 0x02005EFFFF000000, 0xFDFFFFFFFFFFFF7F)],
      [True] * 5 + [False] * 4)
check("keyed IID candidates, attempts 0..2, role 0 then role 1",
      [keyed_iid(K, r, t, EPOCH, a).hex() for r, t in ((0, LOW), (1, HIGH)) for a in range(3)],
      ["7254c650f3a5d874", "0e4fb44a6354cea5", "49a8161fdb9c4c8c",
       "e7f9b0dc441b86e9", "ac7254a503d601ea", "96549de6fdec42ee"])
check("hopping ports role 0 / role 1", (port(K, 0, LOW, EPOCH, 0), port(K, 1, HIGH, EPOCH, 0)),
      (40199, 22970))
check("routes of role 0 at attempt offsets 1..4",
      ["%s -> %s" % (sock(a, pa), sock(b, pb)) for a, pa, b, pb in
       (route(K, EPOCH, k) for k in range(1, 5))],
      ["[2001:db8:a:0:e4f:b44a:6354:cea5]:37090 -> [2001:db8:b:0:ac72:54a5:3d6:1ea]:53308",
       "[2001:db8:a:0:49a8:161f:db9c:4c8c]:8150 -> [2001:db8:b:0:9654:9de6:fdec:42ee]:57518",
       "[2001:db8:a:0:f35c:29df:6045:a3f4]:65021 -> [2001:db8:b:0:37ef:b3f0:f72b:aab8]:47909",
       "[2001:db8:a:0:90a8:4686:b09:57ec]:2503 -> [2001:db8:b:0:4a11:21b5:a41b:2af2]:28625"])


def thesis_iid(true, epoch, attempt, key=K):
    data = ip(true)[8:] + key + struct.pack(">Q", epoch) + (bytes([attempt]) if attempt else b"")
    return hashlib.sha256(data).digest()[:8]


def thesis_pair(prefix_a, prefix_b):
    ta, tb = "2001:db8:a::5", "2001:db8:b::5"
    a, at = search(lambda t: thesis_iid(ta, EPOCH, t), ip(prefix_a), 0)
    b, bt = search(lambda t: thesis_iid(tb, EPOCH, t), ip(prefix_b), 0, taken=a)
    return [(ipstr(a), at), (ipstr(b), bt)]


check("thesis tie-break, shared external /64", thesis_pair("2001:db8:ff::", "2001:db8:ff::"),
      [("2001:db8:ff:0:cc4:97a:96eb:b801", 0), ("2001:db8:ff:0:d196:d414:101a:51eb", 1)])
check("thesis, equal IIDs under different /64s", thesis_pair("2001:db8:a::", "2001:db8:b::"),
      [("2001:db8:a:0:cc4:97a:96eb:b801", 0), ("2001:db8:b:0:cc4:97a:96eb:b801", 0)])

# ---- §4.5 header protection ----


def hp_key(key, role):
    return dk("mt6d-proto 2026-11-23 header protection key sender role %d" % role, key)


def protect(hk, p):
    e = Cipher(algorithms.AES(hk), modes.ECB()).encryptor()
    m = (e.update(p[-16:]) + e.finalize())[:8]
    return bytes(a ^ b for a, b in zip(p[:8], m)) + p[8:]


check("hpKey(role 0)", hp_key(K, 0).hex(),
      "4e17734d5839b990c3cc966867397695f797de49b77c0ece18de9fc8aefd8c7e")

# ---- §9.1 link key ----

PRIV = [bytes(range(0x40, 0x60)), bytes(range(0x60, 0x80))]
SK = [X25519PrivateKey.from_private_bytes(p) for p in PRIV]
PUB = [k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) for k in SK]
check("public keys", [p.hex() for p in PUB],
      ["79a631eede1bf9c98f12032cdeadd0e7a079398fc786b88cc846ec89af85a51a",
       "675dd574ed7789310b3d2e7681f3790b466c773b1521fecf36577958371ea52f"])
lo, hi = sorted(PUB)  # byte-string order
PSK = bytes(32)
# The stream's two true addresses, lower first (role 0's is the lower, §1).
TRUES = (ipaddress.IPv6Address("2001:db8:a::1").packed + ipaddress.IPv6Address("2001:db8:b::2").packed)
links = [dk("mt6d-proto 2026-11-28 stream link key",
            SK[r].exchange(X25519PublicKey.from_public_bytes(PUB[1 - r])) + PSK + lo + hi + TRUES)
         for r in (0, 1)]
check("link key (both sides)", [x.hex() for x in links],
      ["bb99ba206ad441e09e3f4f10f48e2097fdbbd40f53c7f418a5a918ba9c495504"] * 2)
LINK = links[0]

# ---- §9.2, §9.3 Noise IKpsk2 with fixed ephemeral keys ----


def hkdf(ck, ikm, n):
    t = hmac.new(ck, ikm, hashlib.blake2s).digest()
    out, prev = [], b""
    for i in range(1, n + 1):
        prev = hmac.new(t, prev + bytes([i]), hashlib.blake2s).digest()
        out.append(prev)
    return out


class Symmetric:
    def __init__(self, name, prologue):
        self.h = name.ljust(32, b"\0") if len(name) <= 32 else hashlib.blake2s(name).digest()
        self.ck, self.k, self.n = self.h, None, 0
        self.mix_hash(prologue)

    def mix_hash(self, data):
        self.h = hashlib.blake2s(self.h + data).digest()

    def mix_key(self, ikm):
        self.ck, self.k = hkdf(self.ck, ikm, 2)
        self.n = 0

    def mix_key_and_hash(self, ikm):
        self.ck, th, self.k = hkdf(self.ck, ikm, 3)
        self.mix_hash(th)
        self.n = 0

    def _nonce(self):
        return bytes(4) + struct.pack("<Q", self.n)

    def encrypt_and_hash(self, pt):
        c = ChaCha20Poly1305(self.k).encrypt(self._nonce(), pt, self.h)
        self.n += 1
        self.mix_hash(c)
        return c

    def decrypt_and_hash(self, c):
        pt = ChaCha20Poly1305(self.k).decrypt(self._nonce(), c, self.h)
        self.n += 1
        self.mix_hash(c)
        return pt


def dh(priv, pub):
    return priv.exchange(X25519PublicKey.from_public_bytes(pub))


def ephemeral(entropy):
    """snow draws the ephemeral private key first from the attempt's entropy (§9.3)."""
    b = blake3(entropy, derive_key_context="mt6d-proto 2026-11-21 handshake rng").digest(length=32)
    k = X25519PrivateKey.from_private_bytes(b)
    return k, k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


NAME = b"Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s"
PROLOGUE = b"mt6d-proto 2026-11-21 handshake " + min(ip(LOW), ip(HIGH)) + max(ip(LOW), ip(HIGH))
MAC_KEY = dk("mt6d-proto 2026-11-21 handshake mac key", LINK)


def mac(src, sport, dst, dport, msg):
    return keyed(MAC_KEY, src + dst + struct.pack(">HH", sport, dport) + msg, 16)


def exchange(init_entropy, resp_entropy, timestamp_ns, i_phase, r_phase, ra):
    """Role 0 initiates, role 1 answers. Returns (initiation, response, k_i2r, k_r2i, h), h the
    handshake hash once message 2 is written (§9.8: what the session route key takes)."""
    a, pa, b, pb = ra
    # Initiator (role 0; responder static = role 1's public key)
    si = Symmetric(NAME, PROLOGUE)
    si.mix_hash(PUB[1])
    e, epub = ephemeral(init_entropy)
    si.mix_hash(epub)
    si.mix_key(epub)  # psk handshakes also MixKey(e)
    si.mix_key(dh(e, PUB[1]))
    enc_s = si.encrypt_and_hash(PUB[0])
    si.mix_key(dh(SK[0], PUB[1]))
    enc_p = si.encrypt_and_hash(struct.pack(">Q", timestamp_ns) + bytes([i_phase]))
    index = dk("mt6d-proto 2026-11-23 handshake index and jitter", init_entropy)[:4]
    body = bytes([0x81, 0, 0, 0]) + index + epub + enc_s + enc_p
    initiation = body + mac(a, pa, b, pb, body)
    # Responder (role 1): reads message 1, writes message 2
    sr = Symmetric(NAME, PROLOGUE)
    sr.mix_hash(PUB[1])
    sr.mix_hash(epub)
    sr.mix_key(epub)
    sr.mix_key(dh(SK[1], epub))
    assert sr.decrypt_and_hash(enc_s) == PUB[0]
    sr.mix_key(dh(SK[1], PUB[0]))
    sr.decrypt_and_hash(enc_p)
    re, repub = ephemeral(resp_entropy)
    sr.mix_hash(repub)
    sr.mix_key(repub)
    sr.mix_key(dh(re, epub))      # ee
    sr.mix_key(dh(re, PUB[0]))    # se
    sr.mix_key_and_hash(PSK)      # psk2
    enc_r = sr.encrypt_and_hash(bytes([r_phase]))
    body = bytes([0x82, 0, 0, 0]) + index + repub + enc_r
    response = body + mac(b, pb, a, pa, body)
    k_i2r, k_r2i = hkdf(sr.ck, b"", 2)
    return initiation, response, k_i2r, k_r2i, sr.h


RA = route(LINK, EPOCH)
T0 = EPOCH * 10_000 * 1_000_000  # start of epoch e (R = 10 s, no jitter) in ns
init, resp, k_i2r, k_r2i, HS_HASH = exchange(bytes([0xE0] * 32), bytes([0xE1] * 32), T0, 0, 0, RA)
HP0, HP1 = hp_key(LINK, 0), hp_key(LINK, 1)
check("initiation (unprotected)", init.hex(),
      "810000009e0d989ca9a83574cf53197028ce6b5c2daa99bffc104dcdcf80de7adb4af8d828903b0e9f1c872a"
      "891da762dad07823d1cd47fcf5baf4fd00d660969fc2a3c82610e8a63f3516fcd115a6b1198184573a93dbf9"
      "1d308ea6b173e9a004767df3ccefcd32a861692864b30037585a8892942eb3f89a0e368610bb4dc5e7")
check("initiation (wire)", protect(HP0, init)[:8].hex(), "e06e9da61802197a")
check("response (unprotected)", resp.hex(),
      "820000009e0d989cb23e915663e34f6a271881682e25f3200ec8eab9bc5f7defbde62b0d89b1e52d20993b79"
      "4b7487c4b67930284f53732ef6fbc797e0bfd96c143b61df5cf194a8bd")
check("response (wire)", protect(HP1, resp)[:8].hex(), "544ce691d3d47cdc")

# ---- §9.4 data keys, §9.5 phase-bit counters and keepalives ----


def data_key(k):
    return dk("mt6d-proto 2026-11-21 session data key aes256-gcm", k)


def keepalive(key, hk, src, sport, dst, dport, counter):
    c = struct.pack(">Q", counter)
    tag = AESGCM(key).encrypt(bytes(4) + c, b"", src + dst + struct.pack(">HH", sport, dport) + c)
    return protect(hk, c + tag).hex()


a, pa, b, pb = RA
check("data keys i2r / r2i", (data_key(k_i2r).hex(), data_key(k_r2i).hex()),
      ("38638f30c5d5befddba88c3e6de992183647aae0f84e2fe28cc60f11eaadc3ef",
       "8a47108d414e597b4636dfbccb8b2e5d0519ed7376160eac28afb337031b76c5"))
check("keepalive role 0, phase 0, packet 0",
      keepalive(data_key(k_i2r), HP0, a, pa, b, pb, 0), "a45d0f18b2d2328b41a3ca89fa929a7b4e278253b91451f0")
check("keepalive role 1, phase 0, packet 0",
      keepalive(data_key(k_r2i), HP1, b, pb, a, pa, 0), "11a78130357909534be500895fc8d89619809511949eded2")
_, _, k2_i2r, _, _ = exchange(bytes([0xE2] * 32), bytes([0xE3] * 32), T0 + 1_000_000_000, 1, 1, RA)
check("rekey: keepalive role 0, phase 1, packet 0 (counter 4000000000000000)",
      keepalive(data_key(k2_i2r), HP0, a, pa, b, pb, 1 << 62),
      "b6fcd38ee2d79693691444bf57128719b35a0852d73c0196")

# ---- §2.3, §4.1 static data key and a sealed data packet; §5.2 notice ----

RK = route(K, EPOCH)
a, pa, b, pb = RK
check("keyed addresses role 0 / role 1", (ipstr(a), ipstr(b)),
      ("2001:db8:a:0:7254:c650:f3a5:d874", "2001:db8:b:0:e7f9:b0dc:441b:86e9"))
check("thesis IIDs: role 0, role 1, role 0 with MAC, role 0 attempt 1",
      [thesis_iid(LOW, EPOCH, 0).hex(), thesis_iid(HIGH, EPOCH, 0).hex(),
       hashlib.sha256(ip(LOW)[8:] + K + struct.pack(">Q", EPOCH)
                      + bytes.fromhex("00abcd112201")).digest()[:8].hex(),
       thesis_iid(LOW, EPOCH, 1).hex()],
      ["0731459642e1d7e5", "b17209a0b04a7f4e", "1553311c39bcc056", "ee407e9869fa86b8"])
jk = dk("mt6d-proto 2025-01-01 epoch jitter key", K)


def jitter(k):
    return int.from_bytes(keyed(jk, struct.pack(">Q", k), 8), "big") % 5000


check("jitter j(e), boundary(e), boundary(e+1)",
      (jitter(EPOCH), EPOCH * 10000 + jitter(EPOCH), (EPOCH + 1) * 10000 + jitter(EPOCH + 1)),
      (2201, 1700000002201, 1700000011755))
check("hpKey(role 1)", hp_key(K, 1).hex(),
      "131ac4117cdf07e181429d89bc72ad93b6208f67b59b4a329a86a7e9a0b4c3f6")
# Protecting 8 zero bytes followed by the sample leaves the mask itself in front.
check("mask of sample 00..0f under hpKey(role 0)",
      protect(hp_key(K, 0), bytes(8) + bytes(range(16)))[:8].hex(), "f5f93a299db279a3")
INNER = bytes.fromhex("60000000" "0004" "3b" "40") + ip(LOW) + ip(HIGH) + b"mt6d"
body = INNER[:8] + INNER[40:]
ctr = struct.pack(">Q", 1 << 26)
outer = a + b + struct.pack(">HH", pa, pb)
check("sealed payload, plain", body.hex(), "6000000000043b406d743664")
for mode, mname in ((2, "encrypt"), (1, "auth")):
    for aead, ctxname, cls, want_id, want in (
        ("aes256-gcm", "aes256-gcm", AESGCM,
         {2: "e641bddfb55f5640", 1: "125344a79dd4867e"},
         {2: "f9383c2bae04d97e0579d90f0586f65c41623dd498e91d6e956c9087334f32da563ae2d2",
          1: "fc27a1f3f1ca6ff76000000000043b406d7436649c57d10fe31fbeac2626ab38d94a8dae"}),
        ("chacha20-poly1305", "chacha20-poly1305", ChaCha20Poly1305,
         {2: "0b7733f6b44f3f5e", 1: "26aa7d5379103700"},
         {2: "b3ace1076eff439b96dc205be5f2c5a45d0b710bc69db1c4a8fb6ba4fcea9aba441538c0",
          1: "23dad892b76532536000000000043b406d743664cc4c65fd6dd05a2692780473b8fdbed5"})):
        sk = dk("mt6d-proto 2026-11-23 stream data key " + ctxname,
                K + bytes([mode, 0]) + ip(LOW) + ip(HIGH))
        nonce = bytes(4) + ctr
        if mode == 2:
            sealed = ctr + cls(sk).encrypt(nonce, body, outer + ctr)
        else:
            sealed = ctr + body + cls(sk).encrypt(nonce, b"", outer + ctr + body)
        check("sealed payload, %s, %s, counter 2^26" % (mname, aead),
              protect(hp_key(K, 0), sealed).hex(), want[mode])
        check("counter state id, %s, %s" % (mname, aead),
              dk("mt6d-proto 2026-11-23 counter state id", sk)[:8].hex(), want_id[mode])
nk = dk("mt6d-proto 2026-12-01 route move notice key", K)
msg = bytes([0x83, 0, 0, 0]) + struct.pack(">Q", EPOCH) + bytes([1, 0, 0, 0])
notice = msg + keyed(nk, a + b + struct.pack(">HH", pa, pb) + msg, 16)
check("route move notice, offset 1, protected", protect(hp_key(K, 0), notice).hex(),
      "4602b406440259070a21fe8001000000ed20ed8c17b48fb24d70a3a467aa6833")

# ---- §9.8 route sets, from fixed inputs k_i2r = 00..1f, k_r2i = 20..3f, h = 40..5f (the
# crate's `session_route_key_and_route` test; the session set of a real handshake follows) ----
SK_I2R, SK_R2I, SK_H = bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96))
RKEY = dk("mt6d-proto 2026-11-24 session route key", SK_I2R + SK_R2I + SK_H)
check("session route key of fixed inputs", RKEY.hex(),
      "3a93f304cb351437bfbdab3a5155bd3578740e35c0daf1e6ded8f147235549ad")
sa, spa, sb, spb = route(RKEY, EPOCH)
check("session set route of fixed inputs", ("[%s]:%d" % (ipstr(sa), spa), "[%s]:%d" % (ipstr(sb), spb)),
      ("[2001:db8:a:0:59a0:2892:8c84:4207]:50081", "[2001:db8:b:0:1e47:2c0a:1355:3d29]:4182"))
check("session set mac key of fixed inputs", dk("mt6d-proto 2026-11-21 handshake mac key", RKEY).hex(),
      "ae82aa5c87c9a1c0de8526e3fc2d6db333e1308bd02f4fd31914aa805b9a9576")
check("session set mask of 24 zero bytes, role 0, fixed inputs", protect(hp_key(RKEY, 0), bytes(24)).hex(),
      "080d0b17f765be9500000000000000000000000000000000")


# ---- §9.8 the session set of §8's first handshake ----
# K(X) from that handshake's raw split keys and its hash h after message 2; activation
# a(X) = e_init + 2 (the initiation travelled on the link set's route of epoch e).
check("handshake hash h (after message 2)", HS_HASH.hex(),
      "2d0bfc0048004430199c47d3ef7dcd40ecbbccbc552839961178bf2fccbef708")
KX = dk("mt6d-proto 2026-11-24 session route key", k_i2r + k_r2i + HS_HASH)
check("session route key K(X)", KX.hex(),
      "cd6e65ba64a39d27f94056b86892f7befb2d64176404cff035cd3c24cbe1b821")
ACT = EPOCH + 2
for thesis, name, want in (
        (False, "keyed",
         "[2001:db8:a:0:79b8:b2b:d718:507b]:13515 -> [2001:db8:b:0:517b:1c9d:e41:2a9]:12350"),
        (True, "thesis",
         "[2001:db8:a:0:404b:375d:139a:1a27]:13515 -> [2001:db8:b:0:d32b:7617:398d:4563]:12350")):
    a_, pa_, b_, pb_ = route(KX, ACT, thesis=thesis)
    check("session set route at a(X), role 0, " + name, "%s -> %s" % (sock(a_, pa_), sock(b_, pb_)),
          want)
check("session set mac key", dk("mt6d-proto 2026-11-21 handshake mac key", KX).hex(),
      "242b07507d59653b9384e912ca4263bb2040d248e105a4b97b44f9ba7af47277")
check("session set hpKey(role 0)", hp_key(KX, 0).hex(),
      "7b670b62c17fba3572dc4090d57fabace3ccd083e49ccb8bd0b33855b3b65f2f")

# ---- §5.5 link-layer address announcement (0x84) with its freshness stamp ----
a, pa, b, pb = RK
ROUTE_BYTES = a + b + struct.pack(">HH", pa, pb)
LL_MAC = bytes.fromhex("02005e100001")
LL_STAMP = 1_700_000_001_000_000_000  # one second into epoch e, in nanoseconds
ll_pad = keyed(nk, ROUTE_BYTES + b"mt6d link pad", 8)
ll_msg = bytes([0x84, 0]) + LL_MAC + bytes(x ^ y for x, y in zip(struct.pack(">Q", LL_STAMP), ll_pad))
ll = ll_msg + keyed(nk, ROUTE_BYTES + ll_msg, 16)
check("link-layer announcement 02:00:5e:10:00:01, stamp e + 1 s, protected",
      protect(hp_key(K, 0), ll).hex(), "11646ca9867773a1de24f32c9e2cbb035930602c8bd28ec504943402ab604663")

sys.exit(1 if FAILED else 0)
