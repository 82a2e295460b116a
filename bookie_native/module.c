/* Python binding of the bookie storage engine: module bkspark._native, type Store.
 * Every call that may block (locks, writes, fsync, reads) runs with the GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <unistd.h>
#include <pthread.h>

#include "addframe.h"
#include "crc32c.h"
#include "engine.h"
#define BKS_IOFAULT_IMPL /* (the control functions only: this file makes no I/O of its own) */
#include "iofault.h"

static PyObject *ExcNoLedger, *ExcNoEntry, *ExcIO, *ExcBadReq;

typedef struct {
    PyObject_HEAD Engine *e;
    int busy; /* calls running without the GIL (modified only with the GIL held) */
    int replace_entries; /* 1: an add of a held entry with other bytes replaces it (store_adds) */
} StoreObject;

/* every engine call made without the GIL is counted so close() can wait for it */
#define BKS_BEGIN                                                                                                     \
    self->busy++;                                                                                                     \
    eng_errclear();                                                                                                   \
    Py_BEGIN_ALLOW_THREADS
#define BKS_END                                                                                                       \
    Py_END_ALLOW_THREADS self->busy--;

static void close_engine(StoreObject *self, int ck)
{
    Engine *e = self->e;
    self->e = NULL; /* new calls fail with "closed" */
    Py_BEGIN_ALLOW_THREADS eng_close(e, ck); /* wakes every waiter inside the engine */
    Py_END_ALLOW_THREADS while (self->busy > 0)
    {
        Py_BEGIN_ALLOW_THREADS usleep(1000);
        Py_END_ALLOW_THREADS
    }
    Py_BEGIN_ALLOW_THREADS eng_free(e);
    Py_END_ALLOW_THREADS
}

static PyObject *raise_rc(StoreObject *s, int rc, const char *fallback)
{
    const char *msg = eng_errmsg()[0] ? eng_errmsg() : fallback;
    switch (rc) {
    case E_NOLEDGER:
        PyErr_SetString(ExcNoLedger ? ExcNoLedger : PyExc_KeyError, fallback);
        break;
    case E_NOENTRY:
        PyErr_SetString(ExcNoEntry ? ExcNoEntry : PyExc_KeyError, fallback);
        break;
    case E_BADREQ:
        PyErr_SetString(ExcBadReq ? ExcBadReq : PyExc_ValueError, msg);
        break;
    case E_CLOSED:
        PyErr_SetString(ExcIO ? ExcIO : PyExc_OSError, "storage is closed");
        break;
    default:
        PyErr_SetString(ExcIO ? ExcIO : PyExc_OSError, msg);
    }
    return NULL;
}

static int check_open(StoreObject *s)
{
    if (!s->e) {
        PyErr_SetString(ExcIO ? ExcIO : PyExc_OSError, "storage is closed");
        return -1;
    }
    return 0;
}

static int get_ledger_id(PyObject *o, uint64_t *out)
{
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0) {
        PyErr_SetString(ExcBadReq ? ExcBadReq : PyExc_ValueError, "ledger id must be >= 0");
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

/* ------------------------------------------------------------------ Store */
static int Store_init(StoreObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"journal_dirs", "ledger_dirs", "write_cache_bytes", "group_wait_us", "threshold",
                             "journal_max_size", "max_backups", "sync", "entry_log_max_size", "compaction_threshold",
                             "compaction_max_bytes", "checkpoint_interval_ms", "page_cache", "compaction_rate",
                             "index_cache_bytes", "ledger_cache_entries", "index_memtable_bytes",
                             "replace_entries", NULL};
    PyObject *jdirs, *ldirs;
    unsigned long long wcb = 64ull << 20, gw = 2000, thr = 512 << 10, jmax = 512ull << 20, elmax = 1ull << 30,
                       cmax = 64ull << 20, cint = 10000, crate = 0, icache = 32ull << 20, lcache = 65536,
                       imem = 16ull << 20;
    int backups = 5, sync = 1, page_cache = 0, replace = 0;
    double cthr = 0.5;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|KKKKipKdKKpKKKKp", kwlist, &jdirs, &ldirs, &wcb, &gw, &thr, &jmax,
                                     &backups, &sync, &elmax, &cthr, &cmax, &cint, &page_cache, &crate, &icache,
                                     &lcache, &imem, &replace))
        return -1;
    self->replace_entries = replace;
    if (self->e) {
        PyErr_SetString(PyExc_RuntimeError, "Store already initialised");
        return -1;
    }
    PyObject *seq = PySequence_Fast(ldirs, "ledger_dirs must be a sequence of str");
    if (!seq)
        return -1;
    Py_ssize_t nd = PySequence_Fast_GET_SIZE(seq);
    if (nd < 1 || nd > 64) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "ledger_dirs needs 1..64 directories");
        return -1;
    }
    const char *dirs[64];
    for (Py_ssize_t i = 0; i < nd; i++) {
        dirs[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
        if (!dirs[i]) {
            Py_DECREF(seq);
            return -1;
        }
    }
    /* journal_dirs: a sequence of str (one journal per directory), or one str */
    const char *jd[64];
    Py_ssize_t nj = 1;
    PyObject *jseq = NULL;
    if (PyUnicode_Check(jdirs)) {
        jd[0] = PyUnicode_AsUTF8(jdirs);
        if (!jd[0]) {
            Py_DECREF(seq);
            return -1;
        }
    } else {
        jseq = PySequence_Fast(jdirs, "journal_dirs must be a sequence of str");
        if (!jseq) {
            Py_DECREF(seq);
            return -1;
        }
        nj = PySequence_Fast_GET_SIZE(jseq);
        if (nj < 1 || nj > 64) {
            Py_DECREF(seq);
            Py_DECREF(jseq);
            PyErr_SetString(PyExc_ValueError, "journal_dirs needs 1..64 directories");
            return -1;
        }
        for (Py_ssize_t i = 0; i < nj; i++) {
            jd[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(jseq, i));
            if (!jd[i]) {
                Py_DECREF(seq);
                Py_DECREF(jseq);
                return -1;
            }
        }
    }
    EngineConfig cfg = {jd, (int)nj, dirs, (int)nd, wcb, gw, thr, jmax, backups, sync, elmax, cthr, cmax, cint, page_cache, crate,
                       icache, lcache, imem};
    char err[600] = "";
    Engine *e = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = eng_open(&cfg, &e, err, sizeof err);
    Py_END_ALLOW_THREADS Py_DECREF(seq);
    Py_XDECREF(jseq);
    if (rc != E_OK) {
        PyErr_Format(ExcIO ? ExcIO : PyExc_OSError, "cannot open bookie storage: %s", err);
        return -1;
    }
    self->e = e;
    return 0;
}

static void Store_dealloc(StoreObject *self)
{
    if (self->e)
        close_engine(self, 0);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Store_close(StoreObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"checkpoint", NULL};
    int ck = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p", kwlist, &ck))
        return NULL;
    if (self->e)
        close_engine(self, ck);
    Py_RETURN_NONE;
}

/* the bytes of a key/body: exact bytes objects are held by a reference (the list may be changed
 * by another thread while the engine runs without the GIL; a reference costs less than a buffer
 * view), anything else through a buffer view.  *held says which. */
static int get_bytes(PyObject *o, Py_buffer *v, char *held)
{
    if (PyBytes_CheckExact(o)) {
        Py_INCREF(o);
        v->obj = o;
        v->buf = PyBytes_AS_STRING(o);
        v->len = PyBytes_GET_SIZE(o);
        *held = 1;
        return 0;
    }
    *held = 0;
    return PyObject_GetBuffer(o, v, PyBUF_SIMPLE);
}

static void put_bytes(Py_buffer *v, char held)
{
    if (held)
        Py_CLEAR(v->obj);
    else
        PyBuffer_Release(v);
}

typedef struct {
    uint64_t ledger;
    int64_t entry;
    size_t i;
} AddKey;

static int add_key_cmp(const void *a, const void *b)
{
    const AddKey *x = a, *y = b;
    if (x->ledger != y->ledger)
        return x->ledger < y->ledger ? -1 : 1;
    if (x->entry != y->entry)
        return x->entry < y->entry ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Whether the engine takes an add to a ledger of key `key` (keylen 0: any), fenced or not. */
static int engine_takes(const AddReq *r, const unsigned char *key, uint32_t keylen, int fenced)
{
    return (!keylen || (r->keylen == keylen && !memcmp(r->key, key, keylen))) &&
           (!fenced || r->recovery);
}

/* Adds of one entry more than once in a batch: of those the engine takes (the ledger's key;
 * a recovery add if it is fenced; a new ledger's key is its first add's in the batch), the
 * first is stored and a later one with other bytes is marked 1 in other[] (EBADREQ; other is
 * allocated when needed); the others are left to the engine (EUA, EFENCED). A writer's batch
 * names its entries in increasing order, which is checked first; only another order costs a
 * sort. 0, or -1 (out of memory, or the ledger's state unreadable). */
static int mark_batch_repeats(Engine *e, const AddReq *reqs, size_t n, unsigned char **other,
                              size_t *nother)
{
    size_t i = 1;
    while (i < n && (reqs[i].ledger > reqs[i - 1].ledger ||
                     (reqs[i].ledger == reqs[i - 1].ledger && reqs[i].entry > reqs[i - 1].entry)))
        i++;
    if (i >= n)
        return 0;
    AddKey *keys = malloc(n * sizeof *keys);
    if (!keys)
        return -1;
    for (i = 0; i < n; i++)
        keys[i] = (AddKey){reqs[i].ledger, reqs[i].entry, i};
    qsort(keys, n, sizeof *keys, add_key_cmp);
    int rc = 0;
    size_t ledger_first = 0; /* the index in keys[] where the current ledger's adds begin */
    for (size_t g = 0, k; g < n && rc == 0; g = k) {
        if (keys[g].ledger != keys[ledger_first].ledger)
            ledger_first = g;
        for (k = g + 1; k < n && keys[k].ledger == keys[g].ledger && keys[k].entry == keys[g].entry; k++)
            ;
        if (k - g < 2)
            continue;
        unsigned char key[MAX_KEY];
        uint32_t keylen = 0;
        int fenced = 0;
        LedgerInfo li;
        eng_lock(e);
        int r = eng_ledger_info(e, keys[g].ledger, &li);
        if (r == E_OK) {
            fenced = li.fenced;
            keylen = li.has_key && li.keylen <= MAX_KEY ? li.keylen : 0;
            if (keylen)
                memcpy(key, li.key, keylen);
        }
        eng_unlock(e);
        if (r != E_OK && r != E_NOLEDGER) {
            rc = -1;
            break;
        }
        if (!keylen) { /* a new ledger: the key of its first add in the batch */
            size_t first = keys[ledger_first].i;
            for (size_t m = ledger_first; m < n && keys[m].ledger == keys[g].ledger; m++)
                if (keys[m].i < first)
                    first = keys[m].i;
            keylen = reqs[first].keylen <= MAX_KEY ? reqs[first].keylen : 0;
            if (keylen)
                memcpy(key, reqs[first].key, keylen);
        }
        const AddReq *taken = NULL;
        for (size_t m = g; m < k; m++) { /* in batch order: keys[] sorts a group by index */
            const AddReq *b = &reqs[keys[m].i];
            if (!engine_takes(b, key, keylen, fenced))
                continue;
            if (!taken) {
                taken = b;
                continue;
            }
            if (taken->len == b->len && memcmp(taken->body, b->body, b->len) == 0)
                continue;
            if (!*other && !(*other = calloc(n, 1))) {
                rc = -1;
                break;
            }
            if (!(*other)[keys[m].i]) {
                (*other)[keys[m].i] = 1;
                (*nother)++;
            }
        }
    }
    free(keys);
    return rc;
}

/* An entry, once stored, is never replaced by other bytes (issue 49): before storing, the adds
 * of entries this bookie may already hold -- at or below the ledger's last entry; a writer's
 * adds are beyond it, so this costs one ledger lookup a run of adds of one ledger -- are read
 * back, and one whose body differs is answered BKS_EBADREQ and not stored. An add of the same
 * bytes (a recovery write-back, a resend) is stored as before: idempotent. Only adds the engine
 * would take are read back (the ledger's key, and not fenced unless a recovery add: the others
 * get EUA / EFENCED from it, learning nothing of what is held), and at most twice the batch's
 * bytes plus 1 MiB are read back: a held entry beyond that budget is refused unread (no writer
 * of ours re-sends that much). A held entry that cannot be read fails that add alone (EIO).
 * Two adds of one entry in the batch: the first is stored, a later one with other bytes is
 * refused (mark_batch_repeats). Two adds of one new entry in batches racing each other are not
 * caught (neither is held when checked).
 * replace (StorageConfig.replace_entries, the engine's own tests): the last add wins, unchecked.
 * Called without the GIL; *conflicts counts the adds refused EBADREQ. */
static int store_adds(Engine *e, AddReq *reqs, size_t n, int *status, size_t *conflicts, int replace)
{
    unsigned char *other = NULL; /* 1: held with other bytes (EBADREQ); 2: unreadable (EIO) */
    size_t nother = 0;
    uint64_t cur = 0, budget = 1u << 20;
    int64_t last = -1;
    int have = 0, rc = E_OK, takes = 1, fenced = 0;
    unsigned char key[MAX_KEY];
    uint32_t keylen = 0;
    *conflicts = 0;
    for (size_t i = 0; i < n; i++)
        budget += 2ull * reqs[i].len;
    for (size_t i = 0; i < n && !replace; i++) {
        if (!have || reqs[i].ledger != cur) {
            LedgerInfo li;
            eng_lock(e);
            rc = eng_ledger_info(e, reqs[i].ledger, &li);
            last = rc == E_OK ? li.last : -1;
            fenced = rc == E_OK && li.fenced;
            keylen = rc == E_OK && li.has_key && li.keylen <= MAX_KEY ? li.keylen : 0;
            if (keylen)
                memcpy(key, li.key, keylen);
            eng_unlock(e);
            if (rc != E_OK && rc != E_NOLEDGER)
                goto out;
            rc = E_OK;
            cur = reqs[i].ledger;
            have = 1;
        }
        if (reqs[i].entry > last)
            continue;
        takes = engine_takes(&reqs[i], key, keylen, fenced);
        if (!takes)
            continue; /* the engine refuses it (EUA, EFENCED) */
        int kind = 0;
        if (budget < reqs[i].len) {
            kind = 1;
        } else {
            unsigned char *held = NULL;
            uint32_t len = 0;
            int64_t eid;
            int r = eng_read(e, reqs[i].ledger, reqs[i].entry, &held, &len, &eid);
            if (r == E_NOENTRY || r == E_NOLEDGER)
                continue;
            if (r == E_OK) {
                budget -= len < budget ? len : budget;
                kind = len != reqs[i].len || memcmp(held, reqs[i].body, len) != 0;
                free(held);
            } else {
                kind = 2;
            }
        }
        if (kind) {
            if (!other && !(other = calloc(n, 1))) {
                rc = E_IO;
                goto out;
            }
            other[i] = (unsigned char)kind;
            nother++;
        }
    }
    if (!replace && mark_batch_repeats(e, reqs, n, &other, &nother) < 0) {
        rc = E_IO;
        goto out;
    }
    if (!nother) {
        rc = eng_add_entries(e, reqs, n, status);
        goto out;
    }
    AddReq *todo = malloc((n - nother ? n - nother : 1) * sizeof *todo);
    int *st = malloc((n - nother ? n - nother : 1) * sizeof *st);
    if (!todo || !st) {
        free(todo);
        free(st);
        rc = E_IO;
        goto out;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!other[i])
            todo[k++] = reqs[i];
    rc = k ? eng_add_entries(e, todo, k, st) : E_OK;
    k = 0;
    for (size_t i = 0; i < n; i++) {
        if (other[i]) {
            status[i] = other[i] == 2 ? BKS_EIO : BKS_EBADREQ;
            *conflicts += other[i] == 1;
        } else {
            reqs[i] = todo[k]; /* (its checksums, filled in) */
            status[i] = st[k++];
        }
    }
    free(todo);
    free(st);
out:
    free(other);
    return rc;
}

static PyObject *Store_add_entries(StoreObject *self, PyObject *arg)
{
    if (check_open(self) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(arg, "add_entries expects a list of tuples");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    AddReq *reqs = PyMem_Calloc((size_t)(n ? n : 1), sizeof *reqs);
    Py_buffer *views = PyMem_Calloc((size_t)(n ? n : 1) * 2, sizeof *views);
    int *status = PyMem_Calloc((size_t)(n ? n : 1), sizeof *status);
    char *held = PyMem_Calloc((size_t)(n ? n : 1) * 2, 1);
    Py_ssize_t got = 0;
    PyObject *result = NULL;
    if (!reqs || !views || !status || !held) {
        PyErr_NoMemory();
        goto out;
    }
    for (; got < n; got++) {
        PyObject *t = PySequence_Fast_GET_ITEM(seq, got);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 5) {
            PyErr_SetString(PyExc_TypeError,
                            "each entry must be a tuple (ledger_id, entry_id, master_key, recovery, body)");
            goto out;
        }
        AddReq *r = &reqs[got];
        if (get_ledger_id(PyTuple_GET_ITEM(t, 0), &r->ledger) < 0)
            goto out;
        long long eid = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 1));
        if (eid == -1 && PyErr_Occurred())
            goto out;
        if (eid < 0) {
            PyErr_SetString(ExcBadReq ? ExcBadReq : PyExc_ValueError, "entry id must be >= 0");
            goto out;
        }
        r->entry = eid;
        int rec = PyObject_IsTrue(PyTuple_GET_ITEM(t, 3));
        if (rec < 0)
            goto out;
        r->recovery = rec;
        if (get_bytes(PyTuple_GET_ITEM(t, 2), &views[2 * got], &held[2 * got]) < 0)
            goto out;
        if (get_bytes(PyTuple_GET_ITEM(t, 4), &views[2 * got + 1], &held[2 * got + 1]) < 0) {
            put_bytes(&views[2 * got], held[2 * got]);
            goto out;
        }
        if (views[2 * got].len > (Py_ssize_t)MAX_KEY || views[2 * got + 1].len > (Py_ssize_t)MAX_BODY) {
            put_bytes(&views[2 * got], held[2 * got]);
            put_bytes(&views[2 * got + 1], held[2 * got + 1]);
            PyErr_SetString(ExcBadReq ? ExcBadReq : PyExc_ValueError, "master key or entry body too large");
            goto out;
        }
        r->key = views[2 * got].buf;
        r->keylen = (uint32_t)views[2 * got].len;
        r->body = views[2 * got + 1].buf;
        r->len = (uint32_t)views[2 * got + 1].len;
    }
    int rc;
    size_t conflicts;
    Engine *e = self->e;
    int replace = self->replace_entries;
    BKS_BEGIN rc = store_adds(e, reqs, (size_t)n, status, &conflicts, replace);
    BKS_END if (rc != E_OK)
    {
        raise_rc(self, rc, "add failed");
        goto out;
    }
    result = PyList_New(n);
    if (!result)
        goto out;
    for (Py_ssize_t i = 0; i < n; i++)
        PyList_SET_ITEM(result, i, PyLong_FromLong(status[i]));
out:
    for (Py_ssize_t i = 0; i < got; i++) {
        put_bytes(&views[2 * i], held[2 * i]);
        put_bytes(&views[2 * i + 1], held[2 * i + 1]);
    }
    PyMem_Free(held);
    PyMem_Free(reqs);
    PyMem_Free(views);
    PyMem_Free(status);
    Py_DECREF(seq);
    return result;
}


/* lacs[ledger] = max(lacs.get(ledger, -1), lac) */
static int dict_max(PyObject *lacs, uint64_t ledger, int64_t lac)
{
    PyObject *k = PyLong_FromUnsignedLongLong(ledger);
    if (!k)
        return -1;
    PyObject *old = PyDict_GetItemWithError(lacs, k);
    int rc = 0;
    if (old == NULL && PyErr_Occurred())
        rc = -1;
    else if (old == NULL || PyLong_AsLongLong(old) < lac) {
        PyObject *v = PyLong_FromLongLong(lac);
        rc = v ? PyDict_SetItem(lacs, k, v) : -1;
        Py_XDECREF(v);
    }
    Py_DECREF(k);
    return rc;
}

/* ------------------------------------------------------------------ the data port's add batch */
#define AF_MASTER_KEY_LEN 20   /* SHA1("ledger" || password) */
#define AF_ENTRY_HEADER_LEN 32 /* ledger id, entry id, lac, length: 4 x int64 */
#define AF_RECOVERY_ADD 1u

/* why an add is refused before storage (EBADREQ) into msg, or 0 */
static size_t af_rejection(const WireAdd *a, long long max_entry, char *msg, size_t cap)
{
    int n = 0;
    if (a->ledger < 0 || a->entry < 0)
        n = snprintf(msg, cap, "negative ledger or entry id");
    else if (a->keylen != AF_MASTER_KEY_LEN)
        n = snprintf(msg, cap, "master key must be %d bytes", AF_MASTER_KEY_LEN);
    else if (a->len < AF_ENTRY_HEADER_LEN)
        n = snprintf(msg, cap, "entry body shorter than its header");
    else if ((long long)a->len > max_entry || a->len > MAX_BODY)
        n = snprintf(msg, cap, "entry of %zu bytes exceeds max_entry_bytes", a->len);
    else if (a->flags & ~AF_RECOVERY_ADD)
        n = snprintf(msg, cap, "unknown add flags %#x", (unsigned)a->flags);
    return n > 0 ? (size_t)n : 0;
}

/* add_rejection(ledger, entry, key_len, flags, size, max_entry_bytes) -> str | None: why an add
 * must be refused before storage (EBADREQ), or None -- af_rejection, the one statement of the
 * rule, for the adds that arrive as protobuf objects (gRPC) */
static PyObject *mod_add_rejection(PyObject *self, PyObject *args)
{
    (void)self;
    long long ledger, entry, max_entry;
    Py_ssize_t keylen, size;
    unsigned long long flags;
    if (!PyArg_ParseTuple(args, "LLnKnL", &ledger, &entry, &keylen, &flags, &size, &max_entry))
        return NULL;
    WireAdd a = {0};
    a.ledger = ledger;
    a.entry = entry;
    a.keylen = keylen < 0 ? 0 : (size_t)keylen;
    a.flags = flags >> 32 ? UINT32_MAX : (uint32_t)flags;
    a.len = size < 0 ? 0 : (size_t)size;
    char msg[128];
    size_t n = af_rejection(&a, max_entry, msg, sizeof msg);
    if (!n)
        Py_RETURN_NONE;
    return PyUnicode_FromStringAndSize(msg, (Py_ssize_t)n);
}

static int64_t get_be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return (int64_t)v;
}

/* scan_add_batch(payload, max_adds) -> the number of adds of an AddBatch, walked without
 * decoding one (af_scan_batch); BadRequest naming the defect for a message the bookie refuses
 * whole: not protobuf, an add shorter than any valid one, more than max_adds adds. */
static PyObject *mod_scan_add_batch(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer payload;
    long max_adds;
    if (!PyArg_ParseTuple(args, "y*l", &payload, &max_adds))
        return NULL;
    const char *why = "";
    long n;
    Py_BEGIN_ALLOW_THREADS n = af_scan_batch(payload.buf, (size_t)payload.len, max_adds, &why);
    Py_END_ALLOW_THREADS PyBuffer_Release(&payload);
    if (n < 0)
        return PyErr_Format(ExcBadReq ? ExcBadReq : PyExc_ValueError, "malformed AddBatch: %s", why);
    return PyLong_FromLong(n);
}

/* batch_ledgers(payload) -> [(ledger, master key), ...]: the ledgers an AddBatch writes, each
 * with the key of its first add -- one pair per run of adds of one ledger (a writer's message
 * is one run or a few; the caller drops repeats). For the bookie's check that a ledger it has
 * no record of is one the metadata lists, under that key, before an add creates its record. */
static PyObject *mod_batch_ledgers(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer payload;
    if (!PyArg_ParseTuple(args, "y*", &payload))
        return NULL;
    WireAdd *adds = NULL;
    const char *why = "";
    long n;
    Py_BEGIN_ALLOW_THREADS n = af_parse_batch(payload.buf, (size_t)payload.len, &adds, &why);
    Py_END_ALLOW_THREADS
    PyObject *out = n < 0 ? NULL : PyList_New(0);
    if (n < 0)
        PyErr_Format(ExcBadReq ? ExcBadReq : PyExc_ValueError, "malformed AddBatch: %s", why);
    for (long i = 0; out && i < n; i++) {
        if (i && adds[i].ledger == adds[i - 1].ledger)
            continue;
        PyObject *pair = Py_BuildValue("(Ly#)", (long long)adds[i].ledger, (const char *)adds[i].key,
                                       (Py_ssize_t)adds[i].keylen);
        if (!pair || PyList_Append(out, pair) < 0)
            Py_CLEAR(out);
        Py_XDECREF(pair);
    }
    free(adds);
    PyBuffer_Release(&payload);
    return out;
}

/* answer_adds(payload, max_entry_bytes, status, message) -> the AddBatchResponse body refusing
 * every add of an AddBatch, in order: an invalid one EBADREQ with its reason (af_rejection), the
 * others `status` with `message` -- what a read-only or overloaded bookie answers, in C and
 * without storing, so that refusing costs it no Python object per add. */
static PyObject *mod_answer_adds(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer payload;
    long long max_entry;
    int status;
    const char *msg;
    Py_ssize_t msglen;
    if (!PyArg_ParseTuple(args, "y*Lis#", &payload, &max_entry, &status, &msg, &msglen))
        return NULL;
    PyObject *raw = NULL;
    WireAdd *adds = NULL;
    const char *defect = "";
    char why[96];
    long n = af_parse_batch(payload.buf, (size_t)payload.len, &adds, &defect);
    if (n < 0) {
        PyErr_Format(ExcBadReq ? ExcBadReq : PyExc_ValueError, "malformed AddBatch: %s", defect);
        goto out;
    }
    if (msglen > 200)
        msglen = 200;
    raw = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((size_t)n * AF_RESPONSE_MAX(sizeof why + msglen)));
    if (!raw)
        goto out;
    unsigned char *d = (unsigned char *)PyBytes_AS_STRING(raw), *d0 = d;
    for (long i = 0; i < n; i++) { /* in order, as the Python path answers a read-only bookie */
        size_t wl = af_rejection(&adds[i], max_entry, why, sizeof why);
        if (wl)
            d += af_put_response(d, BKS_EBADREQ, adds[i].ledger, adds[i].entry, adds[i].request_id, why, wl);
        else
            d += af_put_response(d, status, adds[i].ledger, adds[i].entry, adds[i].request_id, msg,
                                 (size_t)msglen);
    }
    if (_PyBytes_Resize(&raw, (Py_ssize_t)(d - d0)) < 0)
        raw = NULL;
out:
    free(adds);
    PyBuffer_Release(&payload);
    return raw;
}

/* add_batch(payload, max_entry_bytes) -> (responses, lacs, ok, ok_bytes, failed)
 *
 * The bookie's whole add path for one AddBatch message: parse the wire bytes, refuse invalid
 * adds (EBADREQ: af_rejection), store the rest (durable on return:
 * eng_add_entries waits for the journal's fdatasync, without the GIL), and encode the
 * AddBatchResponse body -- refusals first, then the stored adds in order.  lacs maps each
 * ledger to the highest LAC piggybacked by its stored entries; failed lists the statuses of
 * the adds storage refused (fenced, wrong key, I/O).  A message that is not an AddBatch
 * raises BadRequest and stores nothing. */
static PyObject *Store_add_batch(StoreObject *self, PyObject *args)
{
    Py_buffer payload;
    long long max_entry;
    if (check_open(self) < 0 || !PyArg_ParseTuple(args, "y*L", &payload, &max_entry))
        return NULL;
    PyObject *result = NULL, *lacs = NULL, *failed = NULL, *raw = NULL;
    WireAdd *adds = NULL;
    AddReq *reqs = NULL;
    int *status = NULL;
    size_t *which = NULL;
    char (*why)[96] = NULL;
    const char *defect = "";
    long n = af_parse_batch(payload.buf, (size_t)payload.len, &adds, &defect);
    if (n < 0) {
        PyErr_Format(ExcBadReq ? ExcBadReq : PyExc_ValueError, "malformed AddBatch: %s", defect);
        goto out;
    }
    size_t cnt = (size_t)n, nreq = 0, nbad = 0, bad_text = 0;
    reqs = PyMem_Calloc(cnt ? cnt : 1, sizeof *reqs);
    status = PyMem_Calloc(cnt ? cnt : 1, sizeof *status);
    which = PyMem_Calloc(cnt ? cnt : 1, sizeof *which);
    why = PyMem_Calloc(cnt ? cnt : 1, sizeof *why);
    if (!reqs || !status || !which || !why) {
        PyErr_NoMemory();
        goto out;
    }
    for (size_t i = 0; i < cnt; i++) {
        const WireAdd *a = &adds[i];
        size_t wl = af_rejection(a, max_entry, why[i], sizeof why[i]);
        if (wl) {
            nbad++;
            bad_text += wl;
            continue;
        }
        why[i][0] = 0;
        AddReq *r = &reqs[nreq];
        r->ledger = (uint64_t)a->ledger;
        r->entry = a->entry;
        r->key = a->key;
        r->keylen = (uint32_t)a->keylen;
        r->recovery = (a->flags & AF_RECOVERY_ADD) != 0;
        r->body = a->body;
        r->len = (uint32_t)a->len;
        which[nreq++] = i;
    }
    int rc = E_OK;
    size_t conflicts = 0;
    char io_msg[256] = "";
    static const char other_bytes[] = "entry already stored with other bytes: never replaced";
    if (nreq) {
        Engine *e = self->e;
        int replace = self->replace_entries;
        BKS_BEGIN rc = store_adds(e, reqs, nreq, status, &conflicts, replace);
        BKS_END
        if (rc != E_OK)
            snprintf(io_msg, sizeof io_msg, "%s", rc == E_CLOSED ? "storage is closed"
                                                  : eng_errmsg()[0] ? eng_errmsg() : "add failed");
    }
    size_t io_len = strlen(io_msg);
    raw = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(cnt * AF_RESPONSE_MAX(0) + bad_text + nbad * 3 +
                                                       (rc != E_OK ? nreq * (io_len + 3) : 0) +
                                                       conflicts * (sizeof other_bytes + 3)));
    lacs = PyDict_New();
    failed = PyList_New(0);
    if (!raw || !lacs || !failed)
        goto out;
    unsigned char *d = (unsigned char *)PyBytes_AS_STRING(raw), *d0 = d;
    for (size_t i = 0; i < cnt && nbad; i++) /* refusals first, as the Python path answers */
        if (why[i][0])
            d += af_put_response(d, BKS_EBADREQ, adds[i].ledger, adds[i].entry, adds[i].request_id, why[i],
                                 strlen(why[i]));
    long long ok = 0, ok_bytes = 0;
    uint64_t lac_ledger = 0;
    int64_t lac_max = -1;
    int have_lac = 0;
    for (size_t k = 0; k < nreq; k++) {
        const WireAdd *a = &adds[which[k]];
        int st = rc == E_OK ? status[k] : BKS_EIO;
        if (st == BKS_EBADREQ) /* (storage's only EBADREQ: an entry held with other bytes) */
            d += af_put_response(d, st, a->ledger, a->entry, a->request_id, other_bytes,
                                 sizeof other_bytes - 1);
        else
            d += af_put_response(d, st, a->ledger, a->entry, a->request_id, st == BKS_EOK ? "" : io_msg,
                                 st == BKS_EOK ? 0 : (rc == E_OK ? 0 : io_len));
        if (st != BKS_EOK) {
            PyObject *v = PyLong_FromLong(st);
            if (!v || PyList_Append(failed, v) < 0) {
                Py_XDECREF(v);
                goto out;
            }
            Py_DECREF(v);
            continue;
        }
        ok++;
        ok_bytes += (long long)a->len;
        int64_t lac = get_be64(a->body + 16);
        if (have_lac && lac_ledger != (uint64_t)a->ledger) { /* flush the run of the previous ledger */
            if (dict_max(lacs, lac_ledger, lac_max) < 0)
                goto out;
            have_lac = 0;
        }
        if (!have_lac || lac > lac_max)
            lac_max = lac;
        lac_ledger = (uint64_t)a->ledger;
        have_lac = 1;
    }
    if (have_lac && dict_max(lacs, lac_ledger, lac_max) < 0)
        goto out;
    if (_PyBytes_Resize(&raw, (Py_ssize_t)(d - d0)) < 0)
        goto out;
    result = Py_BuildValue("OOLLO", raw, lacs, ok, ok_bytes, failed);
out:
    Py_XDECREF(raw);
    Py_XDECREF(lacs);
    Py_XDECREF(failed);
    free(adds);
    PyMem_Free(reqs);
    PyMem_Free(status);
    PyMem_Free(which);
    PyMem_Free(why);
    PyBuffer_Release(&payload);
    return result;
}

static PyObject *Store_fence(StoreObject *self, PyObject *args)
{
    PyObject *lo;
    Py_buffer key;
    uint64_t lid;
    if (check_open(self) < 0 || !PyArg_ParseTuple(args, "Oy*", &lo, &key))
        return NULL;
    if (get_ledger_id(lo, &lid) < 0 || key.len > (Py_ssize_t)MAX_KEY) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "master key too long");
        PyBuffer_Release(&key);
        return NULL;
    }
    int rc;
    Engine *e = self->e;
    BKS_BEGIN rc = eng_fence(e, lid, key.buf, (uint32_t)key.len);
    BKS_END PyBuffer_Release(&key);
    if (rc == E_UA)
        return PyLong_FromLong(BKS_EUA);
    if (rc != E_OK)
        return raise_rc(self, rc, "fence failed");
    return PyLong_FromLong(BKS_EOK);
}

/* simple state queries */
enum { Q_FENCED, Q_KEY, Q_HAS, Q_LAST, Q_LAC };

static PyObject *query(StoreObject *self, PyObject *arg, int what)
{
    uint64_t lid;
    if (check_open(self) < 0 || get_ledger_id(arg, &lid) < 0)
        return NULL;
    Engine *e = self->e;
    int found = 0, fenced = 0, has = 0;
    int64_t last = -1;
    unsigned char buf[MAX_KEY];
    unsigned char *lac = NULL;
    uint32_t blen = 0;
    int rc;
    BKS_BEGIN eng_lock(e);
    LedgerInfo li;
    /* (a ledger being deleted is reported absent only once its delete is durable: this may wait
     * for the journal; an error -- the journal or the index failing -- raises, it is no answer) */
    rc = eng_ledger_info(e, lid, &li);
    if (rc == E_OK) {
        found = 1;
        fenced = li.fenced;
        last = li.last;
        if (what == Q_KEY && li.has_key) {
            has = 1;
            blen = li.keylen;
            memcpy(buf, li.key, blen);
        }
        if (what == Q_LAC && li.has_lac) {
            has = 1;
            blen = li.laclen;
            lac = malloc(blen ? blen : 1);
            if (lac)
                memcpy(lac, li.lac, blen);
        }
    }
    eng_unlock(e);
    BKS_END if (rc != E_OK && rc != E_NOLEDGER)
    {
        free(lac);
        return raise_rc(self, rc, "ledger lookup failed");
    }
    switch (what) {
    case Q_FENCED:
        return PyBool_FromLong(fenced);
    case Q_HAS:
        return PyBool_FromLong(found);
    case Q_LAST:
        return PyLong_FromLongLong(last);
    case Q_KEY:
        if (!has)
            Py_RETURN_NONE;
        return PyBytes_FromStringAndSize((char *)buf, blen);
    default:
        if (!has)
            Py_RETURN_NONE;
        if (!lac)
            return PyErr_NoMemory();
        PyObject *r = PyBytes_FromStringAndSize((char *)lac, blen);
        free(lac);
        return r;
    }
}

static PyObject *Store_is_fenced(StoreObject *s, PyObject *a) { return query(s, a, Q_FENCED); }
static PyObject *Store_master_key(StoreObject *s, PyObject *a) { return query(s, a, Q_KEY); }
static PyObject *Store_has_ledger(StoreObject *s, PyObject *a) { return query(s, a, Q_HAS); }
static PyObject *Store_last_entry_id(StoreObject *s, PyObject *a) { return query(s, a, Q_LAST); }
static PyObject *Store_explicit_lac(StoreObject *s, PyObject *a) { return query(s, a, Q_LAC); }

static PyObject *raise_range_rc(StoreObject *self, int rc, uint64_t lid, long long first)
{
    char m[128];
    snprintf(m, sizeof m, rc == E_NOLEDGER ? "no such ledger %llu" : "no such entry %llu:%lld",
             (unsigned long long)lid, first);
    return raise_rc(self, rc, m);
}

/* read_range(ledger, first, last[, max_bytes[, step]]) -> [(entry_id, bytes), ...] */
static PyObject *Store_read_range(StoreObject *self, PyObject *args)
{
    PyObject *lo;
    long long first, last, step = 1;
    unsigned long long maxb = 0;
    uint64_t lid;
    if (check_open(self) < 0 || !PyArg_ParseTuple(args, "OLL|KL", &lo, &first, &last, &maxb, &step) ||
        get_ledger_id(lo, &lid) < 0)
        return NULL;
    if (first < -1)
        return raise_rc(self, E_BADREQ, "bad entry id");
    RangeItem *it = NULL;
    size_t n = 0;
    int rc;
    Engine *e = self->e;
    BKS_BEGIN rc = eng_read_range(e, lid, first, last, step, maxb, NULL, 0, &it, &n);
    BKS_END if (rc != E_OK) return raise_range_rc(self, rc, lid, first);
    PyObject *res = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; i < n; i++) {
        if (res) {
            PyObject *t = Py_BuildValue("(Ly#)", (long long)it[i].entry, (char *)it[i].data, (Py_ssize_t)it[i].len);
            if (!t) {
                Py_CLEAR(res);
            } else {
                PyList_SET_ITEM(res, (Py_ssize_t)i, t);
            }
        }
        free(it[i].data);
    }
    free(it);
    return res;
}

/* read_range_into(ledger, first, last, max_bytes, buffer[, step]) -> [(entry_id, memoryview), ...]: the bodies
 * are read into the caller's writable buffer (reused from call to call: no fresh memory per entry) and returned as
 * views of it, valid until the buffer is written again; [] if the first entry does not fit the buffer. */
static PyObject *Store_read_range_into(StoreObject *self, PyObject *args)
{
    PyObject *lo, *bufobj;
    long long first, last, step = 1;
    unsigned long long maxb;
    uint64_t lid;
    if (check_open(self) < 0 || !PyArg_ParseTuple(args, "OLLKO|L", &lo, &first, &last, &maxb, &bufobj, &step) ||
        get_ledger_id(lo, &lid) < 0)
        return NULL;
    if (first < -1)
        return raise_rc(self, E_BADREQ, "bad entry id");
    Py_buffer view;
    if (PyObject_GetBuffer(bufobj, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    RangeItem *it = NULL;
    size_t n = 0;
    int rc;
    Engine *e = self->e;
    unsigned char *base = view.buf;
    size_t cap = (size_t)view.len;
    BKS_BEGIN rc = eng_read_range(e, lid, first, last, step, maxb, base, cap, &it, &n);
    BKS_END PyObject *res = NULL, *mv = NULL;
    if (rc != E_OK) {
        raise_range_rc(self, rc, lid, first);
        goto out;
    }
    mv = PyMemoryView_FromObject(bufobj);
    res = mv ? PyList_New((Py_ssize_t)n) : NULL;
    for (size_t i = 0; res && i < n; i++) {
        Py_ssize_t off = (Py_ssize_t)(it[i].data - base);
        PyObject *body = PySequence_GetSlice(mv, off, off + (Py_ssize_t)it[i].len);
        PyObject *t = body ? Py_BuildValue("(LN)", (long long)it[i].entry, body) : NULL;
        if (!t)
            Py_CLEAR(res);
        else
            PyList_SET_ITEM(res, (Py_ssize_t)i, t);
    }
out:
    Py_XDECREF(mv);
    free(it);
    PyBuffer_Release(&view);
    return res;
}

static PyObject *Store_read_entry(StoreObject *self, PyObject *args)
{
    PyObject *lo;
    long long entry;
    uint64_t lid;
    if (check_open(self) < 0 || !PyArg_ParseTuple(args, "OL", &lo, &entry) || get_ledger_id(lo, &lid) < 0)
        return NULL;
    if (entry < -1)
        return raise_rc(self, E_BADREQ, "bad entry id");
    unsigned char *d = NULL;
    uint32_t len = 0;
    int64_t eid;
    int rc;
    Engine *e = self->e;
    BKS_BEGIN rc = eng_read(e, lid, entry, &d, &len, &eid);
    BKS_END if (rc != E_OK)
    {
        char m[128];
        snprintf(m, sizeof m, rc == E_NOLEDGER ? "no such ledger %llu" : "no such entry %llu:%lld",
                 (unsigned long long)lid, (long long)entry);
        return raise_rc(self, rc, m);
    }
    PyObject *r = PyBytes_FromStringAndSize((char *)d, len);
    free(d);
    return r;
}

static PyObject *Store_read_last(StoreObject *self, PyObject *arg)
{
    /* (entry_id, body) of the highest entry held */
    uint64_t lid;
    if (check_open(self) < 0 || get_ledger_id(arg, &lid) < 0)
        return NULL;
    unsigned char *d = NULL;
    uint32_t len = 0;
    int64_t eid = -1;
    int rc;
    Engine *e = self->e;
    BKS_BEGIN rc = eng_read(e, lid, -1, &d, &len, &eid);
    BKS_END if (rc != E_OK)
    {
        char m[128];
        snprintf(m, sizeof m, rc == E_NOLEDGER ? "no such ledger %llu" : "ledger %llu has no entries",
                 (unsigned long long)lid);
        return raise_rc(self, rc, m);
    }
    PyObject *r = Py_BuildValue("(Ly#)", (long long)eid, (char *)d, (Py_ssize_t)len);
    free(d);
    return r;
}

static PyObject *Store_set_explicit_lac(StoreObject *self, PyObject *args)
{
    PyObject *lo;
    Py_buffer b;
    uint64_t lid;
    if (check_open(self) < 0 || !PyArg_ParseTuple(args, "Oy*", &lo, &b))
        return NULL;
    if (get_ledger_id(lo, &lid) < 0 || b.len > (Py_ssize_t)MAX_BODY) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "lac body too large");
        PyBuffer_Release(&b);
        return NULL;
    }
    int rc;
    Engine *e = self->e;
    BKS_BEGIN rc = eng_set_lac(e, lid, b.buf, (uint32_t)b.len);
    BKS_END PyBuffer_Release(&b);
    if (rc != E_OK) {
        char m[128];
        snprintf(m, sizeof m, "no such ledger %llu", (unsigned long long)lid);
        return raise_rc(self, rc, m);
    }
    Py_RETURN_NONE;
}

static PyObject *Store_list_entries(StoreObject *self, PyObject *arg)
{
    uint64_t lid;
    if (check_open(self) < 0 || get_ledger_id(arg, &lid) < 0)
        return NULL;
    Engine *e = self->e;
    int64_t *rg = NULL;
    size_t nr = 0;
    int found = 0;
    int rc;
    BKS_BEGIN eng_errclear();
    rc = eng_ledger_ranges(e, lid, &rg, &nr);
    BKS_END if (rc == E_NOLEDGER)
    {
        char m[128];
        snprintf(m, sizeof m, "no such ledger %llu", (unsigned long long)lid);
        return raise_rc(NULL, E_NOLEDGER, m);
    }
    if (rc != E_OK)
        return raise_rc(NULL, rc, eng_errmsg());
    (void)found;
    PyObject *res = PyList_New((Py_ssize_t)nr);
    for (size_t i = 0; res && i < nr; i++)
        PyList_SET_ITEM(res, (Py_ssize_t)i, Py_BuildValue("(LL)", (long long)rg[2 * i], (long long)rg[2 * i + 1]));
    free(rg);
    return res;
}

static PyObject *Store_ledgers(StoreObject *self, PyObject *unused)
{
    if (check_open(self) < 0)
        return NULL;
    Engine *e = self->e;
    uint64_t *ids = NULL;
    size_t n = 0;
    BKS_BEGIN eng_errclear();
    ids = eng_ledger_ids(e, &n);
    BKS_END if (!ids) return raise_rc(NULL, E_IO, eng_errmsg()[0] ? eng_errmsg() : "out of memory listing ledgers");
    PyObject *res = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; res && i < n; i++)
        PyList_SET_ITEM(res, (Py_ssize_t)i, PyLong_FromUnsignedLongLong(ids[i]));
    free(ids);
    if (res && PyList_Sort(res) < 0)
        Py_CLEAR(res);
    return res;
}

#define SIMPLE_CALL(name, call, msg)                                                                                  \
    static PyObject *name(StoreObject *self, PyObject *unused)                                                        \
    {                                                                                                                 \
        if (check_open(self) < 0)                                                                                     \
            return NULL;                                                                                              \
        Engine *e = self->e;                                                                                          \
        int rc;                                                                                                       \
        BKS_BEGIN rc = call;                                                                             \
        BKS_END if (rc != E_OK) return raise_rc(self, rc, msg);                                          \
        Py_RETURN_NONE;                                                                                               \
    }

SIMPLE_CALL(Store_force, eng_force(e), "force failed")
SIMPLE_CALL(Store_checkpoint, eng_checkpoint(e), "checkpoint failed")

static PyObject *Store_delete_ledger(StoreObject *self, PyObject *arg)
{
    uint64_t lid;
    if (check_open(self) < 0 || get_ledger_id(arg, &lid) < 0)
        return NULL;
    Engine *e = self->e;
    int rc;
    BKS_BEGIN rc = eng_delete(e, lid);
    BKS_END if (rc != E_OK) return raise_rc(self, rc, "delete failed");
    Py_RETURN_NONE;
}

static PyObject *Store_compact(StoreObject *self, PyObject *unused)
{
    if (check_open(self) < 0)
        return NULL;
    Engine *e = self->e;
    CompactStats cs;
    int rc;
    BKS_BEGIN rc = eng_compact(e, &cs);
    BKS_END if (rc != E_OK) return raise_rc(self, rc, "compaction failed");
    return Py_BuildValue("{sKsKsKsKsKsKsKsK}", "logs_examined", cs.logs_examined, "logs_compacted",
                         cs.logs_compacted, "logs_deleted", cs.logs_deleted, "bytes_copied", cs.bytes_copied,
                         "bytes_reclaimed", cs.bytes_reclaimed, "entries_copied", cs.entries_copied,
                         "corrupt_entries", cs.corrupt_entries, "deleted_skipped", cs.deleted_skipped);
}

static PyObject *Store_last_log_mark(StoreObject *self, PyObject *unused)
{
    if (check_open(self) < 0)
        return NULL;
    Engine *e = self->e;
    uint64_t id, pos;
    BKS_BEGIN eng_lock(e);
    eng_last_log_mark(e, &id, &pos);
    eng_unlock(e);
    BKS_END return Py_BuildValue("(KK)", id, pos);
}

static PyObject *Store_stats(StoreObject *self, PyObject *unused)
{
    if (check_open(self) < 0)
        return NULL;
    Engine *e = self->e;
    EngineStats c;
    BKS_BEGIN eng_lock(e);
    eng_stats(e, &c);
    eng_unlock(e);
    BKS_END PyObject *d = Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsi}", "adds", c.adds, "add_bytes", c.add_bytes,
        "journal_syncs", c.syncs, "journal_sync_ns_sum", c.sync_ns, "journal_sync_count", c.syncs,
        "journal_bytes", c.jbytes, "direct_reads", c.dio_reads, "direct_read_bytes", c.dio_bytes, "read_ahead_hits", c.ra_hits, "cache_bytes", c.cache_bytes, "queue_depth_bytes", c.pending_len,
        "sync_waiters", c.j_waiters, "checkpoints", c.checkpoints, "flushes", c.flushes,
        "paced_flushes", c.paced_flushes, "hurried_flushes", c.hurried_flushes, "compactions",
        c.compactions, "compacted_logs", c.compacted_logs, "compacted_bytes", c.compacted_bytes,
        "compaction_copying_bytes", c.compact_copying,
        "replayed_records", c.replay_records, "replay_truncated_bytes", c.replay_truncated,
        "background_errors", c.bg_errors, "fences", c.fences, "cache_full_waits", c.cache_waits,
        "journal_zeroed_bytes", c.jz_bytes, "journal_groups_unzeroed", c.jz_behind, "journal_rolls_prepared", c.jn_rolls, "ledgers_cached", c.nledgers,
        "index_cache_bytes", c.index_cache_used, "index_converted_entries", c.converted, "entry_logs", c.nlogs, "entry_log_live_bytes",
        c.log_live, "entry_log_bytes", c.log_total, "journal_id", c.jcur_id, "journal_pos", c.jpos, "journals", c.njournals, "journal_failed",
        c.j_failed);
    if (!d)
        return NULL;
    for (int k = 0; k < TM_N; k++) { /* timers, ns */
        char name[64];
        snprintf(name, sizeof name, "t_%s_ns", eng_tm_names[k]);
        PyObject *v = PyLong_FromUnsignedLongLong(c.tm[k]);
        if (!v || PyDict_SetItemString(d, name, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

/* [(kind "journal" | "ledger", directory, errno, message)] of the directories whose writes failed (sticky) */
static PyObject *Store_disk_errors(StoreObject *self, PyObject *unused)
{
    if (check_open(self) < 0)
        return NULL;
    struct {
        int kind, err;
        char path[4096];
    } *got = malloc(128 * sizeof *got); /* (64 journal + 64 ledger directories at most) */
    if (!got)
        return PyErr_NoMemory();
    int n = 0;
    Engine *e = self->e;
    BKS_BEGIN eng_lock(e);
    for (int kind = 0; kind < 2; kind++)
        for (int k = 0; k < eng_ndirs(e, kind) && n < 128; k++) {
            const char *path;
            int err = eng_dir_error(e, kind, k, &path);
            if (err) {
                got[n].kind = kind;
                got[n].err = err;
                snprintf(got[n++].path, sizeof got[0].path, "%s", path);
            }
        }
    eng_unlock(e);
    BKS_END PyObject *out = PyList_New(0);
    for (int i = 0; out && i < n; i++) {
        PyObject *t = Py_BuildValue("(ssis)", got[i].kind ? "ledger" : "journal", got[i].path, got[i].err,
                                    strerror(got[i].err));
        if (!t || PyList_Append(out, t) < 0)
            Py_CLEAR(out);
        Py_XDECREF(t);
    }
    free(got);
    return out;
}

/* test hook: SIGKILL the process when the engine reaches the named step (checkpoint.c crash_point) */
static PyObject *Store_set_crash_point(StoreObject *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name || check_open(self) < 0)
        return NULL;
    eng_set_crash_point(self->e, name);
    Py_RETURN_NONE;
}

/* test hooks (engine.c pause_point): set_pause_point(step) -- the next thread reaching the step
 * blocks there; pause_wait(timeout_s) -> True once one does; pause_release() lets it go on */
static PyObject *Store_set_pause_point(StoreObject *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name || check_open(self) < 0)
        return NULL;
    Engine *e = self->e;
    BKS_BEGIN eng_set_pause_point(e, name);
    BKS_END Py_RETURN_NONE;
}

static PyObject *Store_pause_wait(StoreObject *self, PyObject *arg)
{
    double t = PyFloat_AsDouble(arg);
    if ((t == -1.0 && PyErr_Occurred()) || check_open(self) < 0)
        return NULL;
    Engine *e = self->e;
    int r;
    BKS_BEGIN r = eng_pause_wait(e, t > 0 ? (uint64_t)(t * 1000) : 0);
    BKS_END return PyBool_FromLong(r);
}

static PyObject *Store_pause_release(StoreObject *self, PyObject *unused)
{
    if (check_open(self) < 0)
        return NULL;
    Engine *e = self->e;
    BKS_BEGIN eng_pause_release(e);
    BKS_END Py_RETURN_NONE;
}

/* test hook: set_journal_group_max(bytes) -- the bound on a journal group's records (0: the default) */
static PyObject *Store_set_journal_group_max(StoreObject *self, PyObject *arg)
{
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    if ((n == (unsigned long long)-1 && PyErr_Occurred()) || check_open(self) < 0)
        return NULL;
    Engine *e = self->e;
    BKS_BEGIN eng_set_journal_group_max(e, n);
    BKS_END Py_RETURN_NONE;
}

/* test hook: set_alloc_fail(n) -> allocations the last compaction pass made; allocation n of
 * every later pass fails (0: none) */
static PyObject *Store_set_alloc_fail(StoreObject *self, PyObject *arg)
{
    unsigned long n = PyLong_AsUnsignedLong(arg);
    if ((n == (unsigned long)-1 && PyErr_Occurred()) || check_open(self) < 0)
        return NULL;
    Engine *e = self->e;
    uint32_t last;
    BKS_BEGIN last = eng_set_alloc_fail(e, (uint32_t)n);
    BKS_END return PyLong_FromUnsignedLong(last);
}

/* test hook: index_put_raw(key, value) -- one raw record into the index (synced) */
static PyObject *Store_index_put_raw(StoreObject *self, PyObject *args)
{
    Py_buffer k, v;
    if (check_open(self) < 0 || !PyArg_ParseTuple(args, "y*y*", &k, &v))
        return NULL;
    Engine *e = self->e;
    int rc;
    BKS_BEGIN rc = eng_index_put_raw(e, k.buf, (size_t)k.len, v.buf, (size_t)v.len);
    BKS_END PyBuffer_Release(&k);
    PyBuffer_Release(&v);
    if (rc != E_OK)
        return raise_rc(self, rc, "index write failed");
    Py_RETURN_NONE;
}

static PyMethodDef Store_methods[] = {
    {"set_crash_point", (PyCFunction)Store_set_crash_point, METH_O, "test hook: SIGKILL at the named engine step"},
    {"set_pause_point", (PyCFunction)Store_set_pause_point, METH_O,
     "test hook: the next thread reaching the named engine step blocks there until pause_release()"},
    {"pause_wait", (PyCFunction)Store_pause_wait, METH_O,
     "test hook: pause_wait(timeout_s) -> True once a thread is held at the pause point"},
    {"pause_release", (PyCFunction)Store_pause_release, METH_NOARGS, "test hook: the held thread goes on"},
    {"set_journal_group_max", (PyCFunction)Store_set_journal_group_max, METH_O,
     "test hook: bound a journal group's records to this many bytes (0: the default, 1 GiB)"},
    {"set_alloc_fail", (PyCFunction)Store_set_alloc_fail, METH_O,
     "test hook: allocation n of every later compaction pass fails (0: none); returns the last pass's count"},
    {"index_put_raw", (PyCFunction)Store_index_put_raw, METH_VARARGS,
     "test hook: index_put_raw(key, value) writes one raw record into the index"},
    {"add_entries", (PyCFunction)Store_add_entries, METH_O, "add a batch; returns list of status codes"},
    {"add_batch", (PyCFunction)Store_add_batch, METH_VARARGS,
     "add_batch(AddBatch bytes, max_entry_bytes) -> (AddBatchResponse bytes, lacs, ok, ok_bytes, failed)"},
    {"fence", (PyCFunction)Store_fence, METH_VARARGS, "fence(ledger, key) -> status"},
    {"is_fenced", (PyCFunction)Store_is_fenced, METH_O, NULL},
    {"master_key", (PyCFunction)Store_master_key, METH_O, NULL},
    {"has_ledger", (PyCFunction)Store_has_ledger, METH_O,
     "has_ledger(ledger) -> bool; False only once its delete is durable (waits for a pending DELETE's sync)"},
    {"last_entry_id", (PyCFunction)Store_last_entry_id, METH_O, NULL},
    {"explicit_lac", (PyCFunction)Store_explicit_lac, METH_O, NULL},
    {"set_explicit_lac", (PyCFunction)Store_set_explicit_lac, METH_VARARGS, NULL},
    {"read_entry", (PyCFunction)Store_read_entry, METH_VARARGS, NULL},
    {"read_last", (PyCFunction)Store_read_last, METH_O, NULL},
    {"read_range", (PyCFunction)Store_read_range, METH_VARARGS, NULL},
    {"read_range_into", (PyCFunction)Store_read_range_into, METH_VARARGS, NULL},
    {"list_entries", (PyCFunction)Store_list_entries, METH_O, NULL},
    {"ledgers", (PyCFunction)Store_ledgers, METH_NOARGS,
     "ledgers() -> ids; a deleted ledger is left out only once its delete is durable"},
    {"delete_ledger", (PyCFunction)Store_delete_ledger, METH_O,
     "delete_ledger(ledger): idempotent; returns once the delete (its own DELETE record, or a pending one) is durable"},
    {"force", (PyCFunction)Store_force, METH_NOARGS, NULL},
    {"checkpoint", (PyCFunction)Store_checkpoint, METH_NOARGS, NULL},
    {"compact", (PyCFunction)Store_compact, METH_NOARGS, NULL},
    {"last_log_mark", (PyCFunction)Store_last_log_mark, METH_NOARGS, NULL},
    {"stats", (PyCFunction)Store_stats, METH_NOARGS, NULL},
    {"disk_errors", (PyCFunction)Store_disk_errors, METH_NOARGS, NULL},
    {"close", (PyCFunction)(void (*)(void))Store_close, METH_VARARGS | METH_KEYWORDS, NULL},
    {NULL, NULL, 0, NULL}};

static PyTypeObject StoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "bkspark._native.Store",
    .tp_basicsize = sizeof(StoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Bookie storage engine (journal, write cache, entry logs, index).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Store_init,
    .tp_dealloc = (destructor)Store_dealloc,
    .tp_methods = Store_methods,
};

/* ------------------------------------------------------------------ module functions */
static PyObject *mod_crc32c(PyObject *m, PyObject *args)
{
    Py_buffer b;
    unsigned int v = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &b, &v))
        return NULL;
    uint32_t r;
    Py_BEGIN_ALLOW_THREADS r = bks_crc32c(v, b.buf, (size_t)b.len);
    Py_END_ALLOW_THREADS PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(r);
}

/* encode_adds(prefix, ledger, first_entry, lac, length, payloads, digest_size) -> list of
 * AddBatch.adds elements (bytes), one per payload, entry ids first_entry, first_entry + 1, ...
 * and cumulative lengths running on from length (af_put_add).  digest_size 4 is CRC-32C, 0 no
 * digest.  Batches over ENCODE_UNLOCKED bytes are digested and copied without the GIL. */
#define ENCODE_UNLOCKED (256u << 10)

static PyObject *mod_encode_adds(PyObject *m, PyObject *args)
{
    Py_buffer prefix;
    long long ledger, first, lac, length;
    PyObject *payloads;
    int digest;
    if (!PyArg_ParseTuple(args, "y*LLLLOi", &prefix, &ledger, &first, &lac, &length, &payloads, &digest))
        return NULL;
    PyObject *seq = NULL, *out = NULL;
    Py_buffer *views = NULL;
    Py_ssize_t n = 0, got = 0;
    if (digest != AF_DIGEST_NONE && digest != AF_DIGEST_CRC32C) {
        PyErr_Format(PyExc_ValueError, "encode_adds: digest size %d (4: crc32c, 0: none)", digest);
        goto done;
    }
    if (first < 0 || ledger < 0) {
        PyErr_SetString(PyExc_ValueError, "encode_adds: negative ledger or entry id");
        goto done;
    }
    seq = PySequence_Fast(payloads, "encode_adds: payloads must be a sequence");
    if (!seq)
        goto done;
    n = PySequence_Fast_GET_SIZE(seq);
    views = PyMem_Calloc((size_t)n + 1, sizeof(Py_buffer));
    out = PyList_New(n);
    if (!views || !out) {
        PyErr_NoMemory();
        goto fail;
    }
    size_t total = 0;
    for (got = 0; got < n;) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &views[got], PyBUF_SIMPLE) < 0)
            goto fail;
        size_t size = af_add_size((size_t)prefix.len, first + got, digest, (size_t)views[got].len);
        got++;
        PyObject *elem = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
        if (!elem)
            goto fail;
        PyList_SET_ITEM(out, got - 1, elem);
        total += size;
    }
    PyThreadState *unlocked = total > ENCODE_UNLOCKED ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        length += views[i].len;
        af_put_add((unsigned char *)PyBytes_AS_STRING(PyList_GET_ITEM(out, i)), prefix.buf, (size_t)prefix.len,
                   ledger, first + i, lac, length, digest, views[i].buf, (size_t)views[i].len);
    }
    if (unlocked)
        PyEval_RestoreThread(unlocked);
    goto release;
fail:
    Py_CLEAR(out);
release:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
done:
    PyMem_Free(views);
    Py_XDECREF(seq);
    PyBuffer_Release(&prefix);
    return out;
}

static PyObject *mod_crc32c_sw(PyObject *m, PyObject *args)
{
    Py_buffer b;
    unsigned int v = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &b, &v))
        return NULL;
    uint32_t r = bks_crc32c_sw(v, b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(r);
}

static PyObject *mod_crc32c_combine(PyObject *m, PyObject *args)
{
    unsigned int a, b;
    unsigned long long n;
    if (!PyArg_ParseTuple(args, "IIK", &a, &b, &n))
        return NULL;
    return PyLong_FromUnsignedLong(bks_crc32c_combine(a, b, n));
}

static PyObject *mod_crc32c_hw(PyObject *m, PyObject *unused) { return PyBool_FromLong(bks_crc32c_hw()); }

static PyObject *mod_set_exceptions(PyObject *m, PyObject *args)
{
    PyObject *a, *b, *c, *d;
    if (!PyArg_ParseTuple(args, "OOOO", &a, &b, &c, &d))
        return NULL;
    Py_XDECREF(ExcNoLedger);
    Py_XDECREF(ExcNoEntry);
    Py_XDECREF(ExcIO);
    Py_XDECREF(ExcBadReq);
    Py_INCREF(a);
    Py_INCREF(b);
    Py_INCREF(c);
    Py_INCREF(d);
    ExcNoLedger = a;
    ExcNoEntry = b;
    ExcIO = c;
    ExcBadReq = d;
    Py_RETURN_NONE;
}

/* ---- test hooks of the I/O fault layer (iofault.h) */
static PyObject *mod_io_fault(PyObject *m, PyObject *args, PyObject *kw)
{
    static char *kws[] = {"op", "path", "errno", "after", "times", "lose", "short", "at", NULL};
    const char *op, *path;
    int err, lose = 1, shortw = 0;
    long after = 0, times = 1;
    long long at = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ssi|llppL", kws, &op, &path, &err, &after, &times, &lose, &shortw,
                                     &at))
        return NULL;
    int k = bks_iof_op(op);
    if (k < 0 || bks_iof_add(k, path, err, after, times, lose, shortw, at) < 0) {
        PyErr_Format(PyExc_ValueError, "io_fault: unknown op %s (open, write, sync_range, sync, rename, "
                     "fallocate, read), a path of 256 bytes or more, or more than 64 rules", op);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *mod_io_faults_clear(PyObject *m, PyObject *unused)
{
    bks_iof_clear();
    Py_RETURN_NONE;
}

static PyObject *mod_io_track(PyObject *m, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    bks_iof_track(on);
    Py_RETURN_NONE;
}

static PyObject *mod_io_fault_counts(PyObject *m, PyObject *unused)
{
    long c[IOF_NOPS];
    bks_iof_counts(c);
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < IOF_NOPS; i++) {
        PyObject *v = PyLong_FromLong(c[i]);
        if (!v || PyDict_SetItemString(d, bks_iof_op_name(i), v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    PyObject *lost = d ? PyLong_FromLong(bks_iof_lost_bytes()) : NULL;
    if (!lost || PyDict_SetItemString(d, "lost_bytes", lost) < 0) {
        Py_XDECREF(lost);
        Py_XDECREF(d);
        return NULL;
    }
    Py_DECREF(lost);
    return d;
}

static PyObject *mod_io_crash(PyObject *m, PyObject *unused)
{
    Py_BEGIN_ALLOW_THREADS bks_iof_crash();
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

/* name_thread(name): the calling OS thread's name (its /proc comm, at most 15 bytes, cut
 * there): what `top -H`, `ps -L` and bench/procstat.py show for a bookie's Python threads, which
 * Python 3.11 leaves all named after the process */
static PyObject *mod_name_thread(PyObject *m, PyObject *arg)
{
    Py_ssize_t n;
    const char *name = PyUnicode_AsUTF8AndSize(arg, &n);
    if (!name)
        return NULL;
    char buf[16];
    size_t k = n < (Py_ssize_t)sizeof buf - 1 ? (size_t)n : sizeof buf - 1;
    memcpy(buf, name, k);
    buf[k] = 0;
    pthread_setname_np(pthread_self(), buf);
    Py_RETURN_NONE;
}

static PyMethodDef mod_methods[] = {
    {"name_thread", mod_name_thread, METH_O,
     "name_thread(name): name the calling OS thread (its first 15 bytes; seen in top -H, /proc)"},
    {"io_fault", (PyCFunction)(void (*)(void))mod_io_fault, METH_VARARGS | METH_KEYWORDS,
     "test hook: io_fault(op, path, errno, after=0, times=1, lose=True, short=False, at=-1) fails (or shortens) "
     "the engine's matching system calls (bookie_native/iofault.h; at: a read only when it includes that "
     "byte, as a bad block does)"},
    {"io_faults_clear", mod_io_faults_clear, METH_NOARGS, "test hook: remove every I/O fault rule"},
    {"io_track", mod_io_track, METH_O, "test hook: track unsynced bytes (for lost writebacks and io_crash)"},
    {"io_fault_counts", mod_io_fault_counts, METH_NOARGS, "test hook: I/O faults fired per op, and lost_bytes"},
    {"io_crash", mod_io_crash, METH_NOARGS, "test hook: drop every unsynced byte, then SIGKILL this process"},

    {"crc32c", mod_crc32c, METH_VARARGS, "crc32c(data, value=0) -> int (Castagnoli)"},
    {"encode_adds", mod_encode_adds, METH_VARARGS,
     "encode_adds(prefix, ledger, first_entry, lac, length, payloads, digest_size) -> [AddBatch element]"},
    {"crc32c_sw", mod_crc32c_sw, METH_VARARGS, "software (slice-by-8) crc32c"},
    {"answer_adds", mod_answer_adds, METH_VARARGS,
     "answer_adds(payload, max_entry_bytes, status, message) -> responses refusing every add"},
    {"batch_ledgers", mod_batch_ledgers, METH_VARARGS,
     "batch_ledgers(payload) -> [(ledger, master key)] of each run of adds of one ledger"},
    {"scan_add_batch", mod_scan_add_batch, METH_VARARGS,
     "scan_add_batch(payload, max_adds) -> number of adds; BadRequest for a message refused whole"},
    {"add_rejection", mod_add_rejection, METH_VARARGS,
     "add_rejection(ledger, entry, key_len, flags, size, max_entry_bytes) -> why an add is refused, or None"},
    {"crc32c_hw", mod_crc32c_hw, METH_NOARGS, "True if the SSE4.2 path is used"},
    {"crc32c_combine", mod_crc32c_combine, METH_VARARGS, "crc32c_combine(crc_a, crc_b, len_b): crc of a+b"},
    {"set_exceptions", mod_set_exceptions, METH_VARARGS,
     "set_exceptions(NoSuchLedger, NoSuchEntry, BookieIO, BadRequest)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "bkspark._native",
                                    "bkspark bookie storage engine (C extension).", -1, mod_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void)
{
    if (PyType_Ready(&StoreType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m)
        return NULL;
    Py_INCREF(&StoreType);
    PyModule_AddObject(m, "Store", (PyObject *)&StoreType);
    PyModule_AddIntConstant(m, "NATIVE", 1);
    PyModule_AddIntConstant(m, "FORMAT_VERSION", 1);
    return m;
}
