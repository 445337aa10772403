/*
 * The link, IPv4 and UDP/TCP header decode of spark_analysis.columnar in C: one pass over
 * the frames of a chunk, where the numpy version (columnar._decode_network_numpy) makes some
 * fifty passes over whole columns, each gathering, casting or scattering.  Measured on the
 * benchmark capture: about 300 ns a frame in numpy, against a few ns here.
 *
 * Nothing about the formats is written down here.  Every size, member offset and constant
 * (link types, ethertypes, protocol numbers, flag masks) is a parameter, computed on the
 * Python side from the wire/ definitions (wire.pcap's derived layouts); the module names its
 * parameters in PARAMS, and Python fills them by name (columnar._NETWORK_PARAMS).  What is
 * here is the control flow, which is the numpy version's, rule for rule: the tests hold the
 * two to the same result on arbitrary frames.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* the parameters, in the order of the params array (and of the PARAMS tuple below) */
#define PARAM_LIST(X) \
    X(LINKTYPE_ETHERNET, "linktype_ethernet") \
    X(LINKTYPE_SLL, "linktype_sll") \
    X(LINKTYPE_SLL2, "linktype_sll2") \
    X(LINKTYPE_NULL, "linktype_null") \
    X(LINKTYPE_RAW_A, "linktype_raw_a") \
    X(LINKTYPE_RAW_B, "linktype_raw_b") \
    X(LINKTYPE_RAW_C, "linktype_raw_c") \
    X(ETH_SIZE, "eth_size") \
    X(ETH_TYPE_AT, "eth_type_at") \
    X(VLAN_SIZE, "vlan_size") \
    X(VLAN_TYPE_AT, "vlan_type_at") \
    X(VLAN_TCI_AT, "vlan_tci_at") \
    X(VLAN_ID_MASK, "vlan_id_mask") \
    X(VLAN_TPID_A, "vlan_tpid_a") \
    X(VLAN_TPID_B, "vlan_tpid_b") \
    X(SLL_SIZE, "sll_size") \
    X(SLL_PROTOCOL_AT, "sll_protocol_at") \
    X(SLL2_SIZE, "sll2_size") \
    X(SLL2_PROTOCOL_AT, "sll2_protocol_at") \
    X(NULL_HEADER_SIZE, "null_header_size") \
    X(NULL_FAMILY_INET, "null_family_inet") \
    X(IPV4_ETHERTYPE, "ipv4_ethertype") \
    X(IP_SIZE, "ip_size") \
    X(IP_VER_IHL_AT, "ip_ver_ihl_at") \
    X(IP_TOTAL_LENGTH_AT, "ip_total_length_at") \
    X(IP_IDENT_AT, "ip_ident_at") \
    X(IP_FLAGS_FRAG_AT, "ip_flags_frag_at") \
    X(IP_PROTOCOL_AT, "ip_protocol_at") \
    X(IP_SRC_AT, "ip_src_at") \
    X(IP_DST_AT, "ip_dst_at") \
    X(FRAG_OFFSET_MASK, "frag_offset_mask") \
    X(MORE_FRAGMENTS_MASK, "more_fragments_mask") \
    X(PROTO_UDP, "proto_udp") \
    X(PROTO_TCP, "proto_tcp") \
    X(UDP_SIZE, "udp_size") \
    X(UDP_SPORT_AT, "udp_sport_at") \
    X(UDP_DPORT_AT, "udp_dport_at") \
    X(TCP_SIZE, "tcp_size") \
    X(TCP_SPORT_AT, "tcp_sport_at") \
    X(TCP_DPORT_AT, "tcp_dport_at") \
    X(TCP_SEQ_AT, "tcp_seq_at") \
    X(TCP_OFFSET_FLAGS_AT, "tcp_offset_flags_at") \
    X(TCP_FLAGS_MASK, "tcp_flags_mask")

#define AS_ENUM(name, text) P_##name,
#define AS_TEXT(name, text) text,
enum { PARAM_LIST(AS_ENUM) N_PARAMS };
static const char *const param_names[] = {PARAM_LIST(AS_TEXT)};

/* the rows of the output array, in order (and the OUTPUTS tuple) */
#define OUTPUT_LIST(X) \
    X(PROTO, "proto") X(SRC, "src") X(DST, "dst") X(SPORT, "sport") X(DPORT, "dport") \
    X(PSTART, "pstart") X(PEND, "pend") X(SEQ, "seq") X(TCP_FLAGS, "tcp_flags") \
    X(FRAGMENT, "fragment") X(STATUS, "status") X(VALUE, "value")
#define AS_OUT_ENUM(name, text) O_##name,
enum { OUTPUT_LIST(AS_OUT_ENUM) N_OUTPUTS };
static const char *const output_names[] = {OUTPUT_LIST(AS_TEXT)};

/* why a frame is skipped (the status row; 0: decoded), and the REASONS tuple */
#define REASON_LIST(X) \
    X(LINK, "link") X(NOT_IPV4, "not_ipv4") X(IPV4_TRUNCATED, "ipv4_truncated") \
    X(NOT_IPV4_HEADER, "not_ipv4_header") X(LATER_FRAGMENT, "later_fragment") \
    X(UDP_TRUNCATED, "udp_truncated") X(TCP_TRUNCATED, "tcp_truncated") \
    X(NOT_UDP_TCP, "not_udp_tcp") X(TCP_DATA_OFFSET, "tcp_data_offset") \
    X(TCP_FRAGMENT, "tcp_fragment") X(SHORT_FRAGMENT, "short_fragment")
#define AS_REASON_ENUM(name, text) R_##name,
enum { R_DECODED, REASON_LIST(AS_REASON_ENUM) N_REASONS };
static const char *const reason_names[] = {"decoded", REASON_LIST(AS_TEXT)};

static inline int64_t
be16(const unsigned char *p)
{
    return (int64_t)p[0] << 8 | p[1];
}

static inline int64_t
be32(const unsigned char *p)
{
    return (int64_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
}

static inline int64_t
le32(const unsigned char *p)
{
    return (int64_t)((uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0]);
}

static inline int64_t
load(const unsigned char *base, Py_ssize_t i)
{
    int64_t v;
    memcpy(&v, base + i * (Py_ssize_t)sizeof v, sizeof v);  /* any alignment */
    return v;
}

/* One frame: its outputs (all zero on entry) set as the numpy version sets them. */
static void
decode_frame(const int64_t *k, const unsigned char *f, int64_t start, int64_t length,
             int64_t linktype, int64_t *o)
{
    int64_t l3 = -1, etype = 0, vlan = 0;
    if (linktype == k[P_LINKTYPE_ETHERNET] && length >= k[P_ETH_SIZE]) {
        etype = be16(f + k[P_ETH_TYPE_AT]);
        l3 = k[P_ETH_SIZE];
        while ((etype == k[P_VLAN_TPID_A] || etype == k[P_VLAN_TPID_B])
               && length >= l3 + k[P_VLAN_SIZE]) {
            vlan = be16(f + l3 + k[P_VLAN_TCI_AT]) & k[P_VLAN_ID_MASK];
            etype = be16(f + l3 + k[P_VLAN_TYPE_AT]);
            l3 += k[P_VLAN_SIZE];
        }
    } else if (linktype == k[P_LINKTYPE_SLL] && length >= k[P_SLL_SIZE]) {
        etype = be16(f + k[P_SLL_PROTOCOL_AT]);
        l3 = k[P_SLL_SIZE];
    } else if (linktype == k[P_LINKTYPE_SLL2] && length >= k[P_SLL2_SIZE]) {
        etype = be16(f + k[P_SLL2_PROTOCOL_AT]);
        l3 = k[P_SLL2_SIZE];
    } else if (linktype == k[P_LINKTYPE_NULL] && length >= k[P_NULL_HEADER_SIZE]) {
        /* the address family in the capturing host's byte order: try little-endian first */
        int64_t family = le32(f);
        if (family > 0xFFFF) {
            family = be32(f);
        }
        etype = family == k[P_NULL_FAMILY_INET] ? k[P_IPV4_ETHERTYPE] : 0;
        l3 = k[P_NULL_HEADER_SIZE];
    } else if ((linktype == k[P_LINKTYPE_RAW_A] || linktype == k[P_LINKTYPE_RAW_B]
                || linktype == k[P_LINKTYPE_RAW_C]) && length >= 1) {
        etype = f[0] >> 4 == 4 ? k[P_IPV4_ETHERTYPE] : 0;
        l3 = 0;
    }
    if (l3 < 0) {
        o[O_STATUS] = R_LINK;
        o[O_VALUE] = linktype;
        return;
    }
    if (etype != k[P_IPV4_ETHERTYPE]) {
        o[O_STATUS] = R_NOT_IPV4;
        o[O_VALUE] = etype;
        return;
    }
    if (length - l3 < k[P_IP_SIZE]) {
        o[O_STATUS] = R_IPV4_TRUNCATED;
        return;
    }
    const unsigned char *ip = f + l3;
    const int64_t ver_ihl = ip[k[P_IP_VER_IHL_AT]];
    const int64_t ihl = (ver_ihl & 0x0F) * 4;
    if (ver_ihl >> 4 != 4 || ihl < k[P_IP_SIZE]) {
        o[O_STATUS] = R_NOT_IPV4_HEADER;
        return;
    }
    const int64_t flags_frag = be16(ip + k[P_IP_FLAGS_FRAG_AT]);
    const int64_t total = be16(ip + k[P_IP_TOTAL_LENGTH_AT]);
    const int64_t end = length < l3 + total ? length : l3 + total;
    const int64_t body = l3 + ihl;
    const int64_t proto = ip[k[P_IP_PROTOCOL_AT]];
    const int more_fragments = (flags_frag & k[P_MORE_FRAGMENTS_MASK]) != 0;
    const int64_t frag_offset = flags_frag & k[P_FRAG_OFFSET_MASK];
    if ((more_fragments || frag_offset) && proto == k[P_PROTO_UDP]
            && length >= l3 + total && total > ihl) {
        /* held for reassembly: the IP payload, with the fields that place it */
        o[O_FRAGMENT] = 1;
        o[O_SRC] = be32(ip + k[P_IP_SRC_AT]);
        o[O_DST] = be32(ip + k[P_IP_DST_AT]);
        o[O_DPORT] = be16(ip + k[P_IP_IDENT_AT]) | vlan << 16;  /* the innermost tag's */
        o[O_SEQ] = frag_offset * 8;
        o[O_TCP_FLAGS] = more_fragments;
        o[O_PSTART] = start + body;
        o[O_PEND] = start + end;
        return;
    }
    if (frag_offset) {  /* not reassembled (a first fragment is decoded as far as it goes) */
        o[O_STATUS] = proto == k[P_PROTO_UDP] ? R_SHORT_FRAGMENT : R_LATER_FRAGMENT;
        return;
    }
    if (more_fragments && proto != k[P_PROTO_UDP] && proto != k[P_PROTO_TCP]
            && length >= l3 + total && total > ihl) {
        /* a whole first fragment of another protocol: tshark holds it for reassembly */
        o[O_STATUS] = R_LATER_FRAGMENT;
        return;
    }
    const unsigned char *l4 = f + body;
    if (proto == k[P_PROTO_UDP]) {
        if (end - body < k[P_UDP_SIZE]) {
            o[O_STATUS] = R_UDP_TRUNCATED;
            return;
        }
        o[O_SRC] = be32(ip + k[P_IP_SRC_AT]);
        o[O_DST] = be32(ip + k[P_IP_DST_AT]);
        o[O_PROTO] = proto;
        o[O_SPORT] = be16(l4 + k[P_UDP_SPORT_AT]);
        o[O_DPORT] = be16(l4 + k[P_UDP_DPORT_AT]);
        o[O_PSTART] = start + body + k[P_UDP_SIZE];
        o[O_PEND] = start + end;
    } else if (proto == k[P_PROTO_TCP]) {
        if (end - body < k[P_TCP_SIZE]) {
            o[O_STATUS] = R_TCP_TRUNCATED;
            return;
        }
        /* the numpy version gives a TCP row its addresses before checking the data offset */
        o[O_SRC] = be32(ip + k[P_IP_SRC_AT]);
        o[O_DST] = be32(ip + k[P_IP_DST_AT]);
        const int64_t offset_flags = be16(l4 + k[P_TCP_OFFSET_FLAGS_AT]);
        const int64_t data_at = body + (offset_flags >> 12) * 4;
        if ((offset_flags >> 12) * 4 < k[P_TCP_SIZE] || data_at > end) {
            o[O_STATUS] = R_TCP_DATA_OFFSET;
            return;
        }
        if (more_fragments) {
            o[O_STATUS] = R_TCP_FRAGMENT;
            return;
        }
        o[O_PROTO] = proto;
        o[O_SPORT] = be16(l4 + k[P_TCP_SPORT_AT]);
        o[O_DPORT] = be16(l4 + k[P_TCP_DPORT_AT]);
        o[O_SEQ] = be32(l4 + k[P_TCP_SEQ_AT]);
        o[O_TCP_FLAGS] = offset_flags & k[P_TCP_FLAGS_MASK];
        o[O_PSTART] = start + data_at;
        o[O_PEND] = start + end;
    } else {
        o[O_STATUS] = R_NOT_UDP_TCP;
        o[O_VALUE] = proto;
    }
}

PyDoc_STRVAR(decode_doc,
"decode(data, starts, lengths, linktypes, params, out, /) -> None\n"
"\n"
"Decode the link, IPv4 and UDP/TCP headers of n frames.  Frame i is the `lengths[i]`\n"
"bytes of `data` from `starts[i]`, captured with link type `linktypes[i]` (three int64\n"
"buffers of n items).  `params` holds the int64 values named by PARAMS, in that order.\n"
"`out` is a writable int64 buffer of len(OUTPUTS) rows of n items, all of them written: row\n"
"r, item i is OUTPUTS[r] of frame i (0 where the frame does not get that far).  The status row holds an index into REASONS (0: decoded), the\n"
"value row the link type, ethertype or IP protocol that a skip reason names.  Raises\n"
"ValueError, having written nothing, when a buffer has the wrong size or a frame lies\n"
"outside `data`.");

static PyObject *
decode(PyObject *module, PyObject *args)
{
    Py_buffer data, starts, lengths, linktypes, params, out;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*w*:decode", &data, &starts, &lengths, &linktypes,
                          &params, &out)) {
        return NULL;
    }
    PyObject *result = NULL;
    const Py_ssize_t n = starts.len / (Py_ssize_t)sizeof(int64_t);
    if (starts.len % (Py_ssize_t)sizeof(int64_t) || lengths.len != starts.len
            || linktypes.len != starts.len) {
        PyErr_SetString(PyExc_ValueError,
                        "starts, lengths and linktypes must be int64 buffers of one length");
        goto done;
    }
    if (params.len != N_PARAMS * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_Format(PyExc_ValueError, "params must hold %d int64 values", N_PARAMS);
        goto done;
    }
    if (out.len != N_OUTPUTS * n * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_Format(PyExc_ValueError, "out must hold %d rows of %zd int64 values",
                     N_OUTPUTS, n);
        goto done;
    }
    int64_t k[N_PARAMS];
    memcpy(k, params.buf, sizeof k);
    const unsigned char *s = starts.buf, *l = lengths.buf, *t = linktypes.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t at = load(s, i), length = load(l, i);
        if (at < 0 || length < 0 || at > data.len || length > data.len - at) {
            PyErr_Format(PyExc_ValueError, "frame %zd (%lld bytes at %lld) lies outside the "
                         "%zd bytes of data", i, (long long)length, (long long)at, data.len);
            goto done;
        }
    }
    const unsigned char *bytes = data.buf;
    unsigned char *o = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t row[N_OUTPUTS] = {0};
        const int64_t at = load(s, i);
        decode_frame(k, bytes + at, at, load(l, i), load(t, i), row);
        for (int r = 0; r < N_OUTPUTS; r++) {
            memcpy(o + (r * n + i) * (Py_ssize_t)sizeof(int64_t), &row[r], sizeof row[r]);
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&linktypes);
    PyBuffer_Release(&params);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *
names_tuple(const char *const *names, int count)
{
    PyObject *tuple = PyTuple_New(count);
    if (tuple == NULL) {
        return NULL;
    }
    for (int i = 0; i < count; i++) {
        PyObject *text = PyUnicode_FromString(names[i]);
        if (text == NULL) {
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, i, text);
    }
    return tuple;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, decode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_netheaders",
    "The link, IPv4 and UDP/TCP header decode of spark_analysis.columnar, compiled "
    "(see columnar._decode_network).", -1, methods,
};

PyMODINIT_FUNC
PyInit__netheaders(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    const char *const *lists[] = {param_names, output_names, reason_names};
    const int counts[] = {N_PARAMS, N_OUTPUTS, N_REASONS};
    const char *attrs[] = {"PARAMS", "OUTPUTS", "REASONS"};
    for (int i = 0; i < 3; i++) {
        PyObject *names = names_tuple(lists[i], counts[i]);
        int failed = names == NULL || PyModule_AddObjectRef(m, attrs[i], names) < 0;
        Py_XDECREF(names);
        if (failed) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
