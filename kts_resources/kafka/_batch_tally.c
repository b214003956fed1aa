/*
 * The magic-2 part of records.tally_batches in C: walk whole record batches over a buffer, check
 * each one's CRC-32C and sum up what the inventory keeps of them.
 *
 * Why C: at ~1.6 KB batches the Python loop pays an interpreter round (a struct unpack, a slice,
 * a crc32c() call with its argument parsing) per batch, which costs more than checksumming the
 * batch itself (bench/inventory_bench.py). Here the whole walk is one call.
 *
 * It judges nothing beyond "a whole magic-2 batch": it stops at the first bytes that are not one
 * (short, legacy magic, bad length, cut off) and says where, so records.py's scan_batches words
 * the problem and reads legacy messages in one place. records.walk_v2_batches_python is the same
 * walk in Python, the fallback when this module was not built; the tests hold the two equal.
 *
 * Layout of a magic-2 batch header (big-endian; see KAFKA_FORMATS.md):
 *   0 baseOffset q, 8 batchLength i, 12 partitionLeaderEpoch i, 16 magic b, 17 crc I,
 *   21 attributes h, 23 lastOffsetDelta i, 27 baseTimestamp q, 35 maxTimestamp q,
 *   43 producerId q, 51 producerEpoch h, 53 baseSequence i, 57 recordsCount i; 61 bytes.
 * The CRC covers attributes to the batch's end, so the broker can rewrite offset and epoch.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LOG_OVERHEAD 12
#define V2_HEADER_SIZE 61
#define V2_CRC_START 21
#define MIN_V2_BATCH_LENGTH (V2_HEADER_SIZE - LOG_OVERHEAD)

/* --- CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) ----------------------------------- */

/* Slicing-by-8: eight bytes a step through eight 256-entry tables, for CPUs without SSE4.2. */
static uint32_t crc_tables[8][256];

static void build_crc_tables(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_tables[0][n] = c;
    }
    /* Table t gives a byte's contribution t bytes further on: one more zero byte through table 0. */
    for (int t = 1; t < 8; t++)
        for (uint32_t n = 0; n < 256; n++) {
            uint32_t prev = crc_tables[t - 1][n];
            crc_tables[t][n] = (prev >> 8) ^ crc_tables[0][prev & 0xFF];
        }
}

/* ``init``: the CRC-32C of the bytes before these (0 for none), so a checksum can go on over
 * several buffers, as the crc32c library's ``value`` does. */
static uint32_t crc32c_table(uint32_t init, const unsigned char *p, size_t n)
{
    uint32_t crc = ~init;
    while (n >= 8) {
        /* Byte by byte rather than one 64-bit load: no assumption about the host's byte order. */
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = crc_tables[7][lo & 0xFF] ^ crc_tables[6][(lo >> 8) & 0xFF] ^ crc_tables[5][(lo >> 16) & 0xFF]
            ^ crc_tables[4][lo >> 24] ^ crc_tables[3][p[4]] ^ crc_tables[2][p[5]] ^ crc_tables[1][p[6]]
            ^ crc_tables[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc_tables[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SSE42_PATH 1
#include <nmmintrin.h>

/* The crc32 instruction computes exactly this polynomial, 8 bytes an instruction, but each one
 * waits ~3 cycles for the one before. So the bytes go in three lanes of LANE bytes at once (three
 * independent registers keep the unit busy), then the lanes are joined: the register is linear,
 * so crc(A|B|C) = shift(crc(A), 2 LANE) ^ shift(crc_0(B), LANE) ^ crc_0(C), where crc_0 starts from
 * a zero register and shift(c, n) is c run through n zero bytes: a fixed linear map of 32 bits,
 * four byte-table lookups (lane_shift). At ~1.6 KB batches that is the difference between the CRC
 * costing as much as everything else in the walk and about a third of it. */
#define LANE 256
static uint32_t lane_shift[2][4][256]; /* [0]: over LANE zero bytes, [1]: over 2 LANE */

static uint32_t zero_bytes(uint32_t c, size_t n)
{
    while (n--)
        c = (c >> 8) ^ crc_tables[0][c & 0xFF];
    return c;
}

static void build_lane_shift_tables(void)
{
    for (int which = 0; which < 2; which++)
        for (int k = 0; k < 4; k++)
            for (uint32_t v = 0; v < 256; v++)
                lane_shift[which][k][v] = zero_bytes(v << (8 * k), (size_t)LANE * (which + 1));
}

static inline uint32_t shift_lanes(const uint32_t t[4][256], uint32_t c)
{
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
}

static inline uint64_t load64(const unsigned char *p)
{
    uint64_t word;
    memcpy(&word, p, 8); /* x86 reads unaligned words; memcpy says so without undefined behaviour */
    return word;
}

/* Compiled for SSE4.2 in these functions only, so the module still loads on a CPU without it
 * (checked at run time before this is ever called). */
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t init, const unsigned char *p, size_t n)
{
    uint64_t crc = ~init;
    while (n >= 3 * LANE) {
        uint64_t a = crc, b = 0, c = 0;
        for (size_t i = 0; i < LANE; i += 8) {
            a = _mm_crc32_u64(a, load64(p + i));
            b = _mm_crc32_u64(b, load64(p + LANE + i));
            c = _mm_crc32_u64(c, load64(p + 2 * LANE + i));
        }
        crc = shift_lanes(lane_shift[1], (uint32_t)a) ^ shift_lanes(lane_shift[0], (uint32_t)b) ^ (uint32_t)c;
        p += 3 * LANE;
        n -= 3 * LANE;
    }
    while (n >= 8) {
        crc = _mm_crc32_u64(crc, load64(p));
        p += 8;
        n -= 8;
    }
    uint32_t c = (uint32_t)crc;
    while (n--)
        c = _mm_crc32_u8(c, *p++);
    return ~c;
}
#endif

typedef uint32_t (*crc_fn)(uint32_t, const unsigned char *, size_t);
static crc_fn crc32c_impl = crc32c_table;

/* --- big-endian reads ------------------------------------------------------------------------ */

static inline int32_t read_i32(const unsigned char *p)
{
    return (int32_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3]);
}

static inline int64_t read_i64(const unsigned char *p)
{
    return (int64_t)((uint64_t)(uint32_t)read_i32(p) << 32 | (uint64_t)(uint32_t)read_i32(p + 4));
}

/* --- growable arrays for what the walk collects while it does not hold the GIL -------------- */

typedef struct {
    int64_t *items;
    size_t len, cap;
} int64_array;

static int append_int64(int64_array *a, int64_t v)
{
    if (a->len == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 16;
        int64_t *items = realloc(a->items, cap * sizeof *items);
        if (!items)
            return -1;
        a->items = items;
        a->cap = cap;
    }
    a->items[a->len++] = v;
    return 0;
}

static PyObject *int64_list(const int64_array *a)
{
    PyObject *list = PyList_New((Py_ssize_t)a->len);
    if (!list)
        return NULL;
    for (size_t i = 0; i < a->len; i++) {
        PyObject *v = PyLong_FromLongLong(a->items[i]);
        if (!v) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    return list;
}

/* --- the walk -------------------------------------------------------------------------------- */

PyDoc_STRVAR(walk_v2_batches_doc,
"walk_v2_batches(buffer) -> (end, batches, records, max_timestamp, epoch_changes, crc_failures, last)\n\n"
"Walk whole magic-2 batches from the buffer's start, checking every CRC-32C; stop at the first\n"
"bytes that are not one. end: where it stopped; max_timestamp: None without batches;\n"
"epoch_changes: the non-negative leader epochs each time the epoch changes from the batch before;\n"
"crc_failures: positions of the batches failing their CRC; last: position of the last batch.");

static PyObject *walk_v2_batches(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *data = view.buf;
    const Py_ssize_t end = view.len;
    Py_ssize_t pos = 0, last = 0;
    long long count = 0, records = 0;
    int64_t max_ts = INT64_MIN;
    int64_t epoch = INT64_MIN; /* below any int32: the first batch's epoch is always a change */
    int64_array epochs = {0}, failures = {0};
    int out_of_memory = 0;
    crc_fn crc = crc32c_impl;

    /* Only this function's locals and the exporter's buffer (which cannot be resized while we hold
     * the export) are touched in here, so other threads — Spark's Python workers, a reader — run. */
    Py_BEGIN_ALLOW_THREADS
    while (end - pos >= V2_HEADER_SIZE) {
        const unsigned char *h = data + pos;
        int32_t batch_length = read_i32(h + 8);
        /* In 64 bits: a length near INT32_MAX must not wrap into a plausible size. */
        int64_t size = (int64_t)batch_length + LOG_OVERHEAD;
        if ((signed char)h[16] != 2 || batch_length < MIN_V2_BATCH_LENGTH || size > (int64_t)(end - pos))
            break;
        uint32_t stored = (uint32_t)read_i32(h + 17);
        if (crc(0, h + V2_CRC_START, (size_t)(size - V2_CRC_START)) != stored) {
            if (append_int64(&failures, pos) < 0) {
                out_of_memory = 1;
                break;
            }
        }
        int32_t leader_epoch = read_i32(h + 12);
        if (leader_epoch != epoch) {
            epoch = leader_epoch;
            if (leader_epoch >= 0 && append_int64(&epochs, leader_epoch) < 0) {
                out_of_memory = 1;
                break;
            }
        }
        int64_t batch_max_ts = read_i64(h + 35);
        if (batch_max_ts > max_ts)
            max_ts = batch_max_ts;
        records += read_i32(h + 57);
        count++;
        last = pos;
        pos += (Py_ssize_t)size;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);

    PyObject *result = NULL;
    if (out_of_memory) {
        PyErr_NoMemory();
    } else {
        PyObject *epoch_list = int64_list(&epochs);
        PyObject *failure_list = epoch_list ? int64_list(&failures) : NULL;
        if (failure_list) {
            PyObject *max_obj = count ? PyLong_FromLongLong(max_ts) : Py_NewRef(Py_None);
            if (max_obj)
                result = Py_BuildValue("(nLLNNNn)", pos, count, records, max_obj, epoch_list, failure_list, last);
            else {
                Py_DECREF(epoch_list);
                Py_DECREF(failure_list);
            }
        } else {
            Py_XDECREF(epoch_list);
        }
    }
    free(epochs.items);
    free(failures.items);
    return result;
}

PyDoc_STRVAR(crc32c_doc, "crc32c(buffer, value=0) -> int\n\nCRC-32C of the buffer, going on from ``value`` (the CRC-32C "
                         "of what came before), as the crc32c library's function: kts's checksums (kafka/crc.py).");

/* Large buffers (a segment's chunk, an upload part) are summed without the GIL, so a server's
 * or a Spark worker's other threads run meanwhile; small ones are not worth the hand-over. */
#define CRC_WITHOUT_GIL_BYTES 65536

static PyObject *crc_with(crc_fn fn, PyObject *args)
{
    Py_buffer view;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I:crc32c", &view, &value))
        return NULL;
    uint32_t c;
    if (view.len >= CRC_WITHOUT_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        c = fn((uint32_t)value, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        c = fn((uint32_t)value, view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *crc32c_py(PyObject *self, PyObject *args)
{
    return crc_with(crc32c_impl, args);
}

static PyObject *crc32c_table_py(PyObject *self, PyObject *args)
{
    return crc_with(crc32c_table, args);
}

static PyMethodDef methods[] = {
    {"walk_v2_batches", walk_v2_batches, METH_O, walk_v2_batches_doc},
    {"crc32c", crc32c_py, METH_VARARGS, crc32c_doc},
    {"crc32c_table", crc32c_table_py, METH_VARARGS,
     "crc32c_table(buffer) -> int\n\nCRC-32C by the slicing-by-8 tables, whatever the CPU has (for tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kts_resources.kafka._batch_tally",
    "The magic-2 walk of records.tally_batches in C (see records.walk_v2_batches_python).", -1, methods,
};

PyMODINIT_FUNC PyInit__batch_tally(void)
{
    build_crc_tables();
#ifdef HAVE_SSE42_PATH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        build_lane_shift_tables();
        crc32c_impl = crc32c_sse42;
    }
#endif
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddStringConstant(m, "CRC32C_ROUTINE", crc32c_impl == crc32c_table ? "slicing-by-8" : "sse4.2") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
