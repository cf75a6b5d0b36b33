/* JSON text from Python values (at intern time, with the GIL) and the
 * hand-written number formatting used per event by the writer. */
#include "core.h"

#include <float.h>
#include <math.h>

int dft_buf_grow(dft_buf *b, size_t extra) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

void dft_buf_free(dft_buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* "00".."99": most numbers of an aggregate record (bucket counts, steps) are below 100 */
static const char two_digits[201] = "0001020304050607080910111213141516171819202122232425262728293031323334353637383940414243444546474849"
                                    "5051525354555657585960616263646566676869707172737475767778798081828384858687888990919293949596979899";

char *dft_fmt_u64(char *p, uint64_t v) {
    if (v < 100) {
        memcpy(p, two_digits + 2 * v + (v < 10), 2);
        return p + 1 + (v >= 10);
    }
    if (v < 100000000)
        return dft_put_digits(p, dft_digits8((uint32_t)v), 8);
    uint64_t hi = v / 100000000;
    if (hi < 100000000) {
        p = dft_put_digits(p, dft_digits8((uint32_t)hi), 8);
    } else {
        p = dft_put_digits(p, dft_digits8((uint32_t)(hi / 100000000)), 8);
        p = dft_put8(p, dft_digits8((uint32_t)(hi % 100000000)));
    }
    return dft_put8(p, dft_digits8((uint32_t)(v % 100000000)));
}

char *dft_fmt_i64(char *p, int64_t v) {
    if (v >= 0)
        return dft_fmt_u64(p, (uint64_t)v);
    *p++ = '-';
    return dft_fmt_u64(p, 0ull - (uint64_t)v);
}

/* Most durations are below 0.1 s: their µs and decimals come from one digits8. */
char *dft_fmt_us(char *p, uint64_t ns) {
    uint64_t d;
    if (ns < 100000000) {
        d = dft_digits8((uint32_t)ns);
        p = dft_put_digits(p, d, 5);
    } else {
        p = dft_fmt_u64(p, ns / 1000);
        d = dft_digits8((uint32_t)(ns % 1000));
    }
    uint32_t f = (uint32_t)(d >> 40); /* the three decimals, one per byte */
    if (f) { /* '.' and the decimals up to the last nonzero one */
        uint32_t t = '.' | (f + 0x303030u) << 8;
        memcpy(p, &t, 4);
        p += 4 - ((unsigned)__builtin_clz(f) - 8) / 8;
    }
    return p;
}

static const char hexd[] = "0123456789abcdef";

/* Worst case per code point: \u00XX (6 bytes) or 4 UTF-8 bytes. A backslash
 * that ends the string is written as \u005c: Perfetto's JSON tokenizer (v52)
 * takes \\" for an escaped quote and then loses the event or the file. */
int dft_json_str(dft_buf *b, PyObject *s) {
    if (!PyUnicode_Check(s)) {
        PyErr_Format(PyExc_TypeError, "expected str, got %.100s", Py_TYPE(s)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (dft_buf_reserve(b, (size_t)n * 6 + 2) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    char *o = b->p + b->len;
    *o++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x80) {
            if (c >= 0x20 && c != '"' && c != '\\') {
                *o++ = (char)c;
                continue;
            }
            *o++ = '\\';
            switch (c) {
            case '"': *o++ = '"'; break;
            case '\n': *o++ = 'n'; break;
            case '\t': *o++ = 't'; break;
            case '\r': *o++ = 'r'; break;
            case '\\':
                if (i + 1 < n) {
                    *o++ = '\\';
                    break;
                }
                /* fall through */
            default:
                memcpy(o, "u00", 3);
                o[3] = hexd[c >> 4];
                o[4] = hexd[c & 15];
                o += 5;
            }
        } else if (c < 0x800) {
            *o++ = (char)(0xC0 | (c >> 6));
            *o++ = (char)(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            if (c >= 0xD800 && c <= 0xDFFF) /* lone surrogate: not encodable */
                c = 0xFFFD;
            *o++ = (char)(0xE0 | (c >> 12));
            *o++ = (char)(0x80 | ((c >> 6) & 0x3F));
            *o++ = (char)(0x80 | (c & 0x3F));
        } else {
            *o++ = (char)(0xF0 | (c >> 18));
            *o++ = (char)(0x80 | ((c >> 12) & 0x3F));
            *o++ = (char)(0x80 | ((c >> 6) & 0x3F));
            *o++ = (char)(0x80 | (c & 0x3F));
        }
    }
    *o++ = '"';
    b->len = (size_t)(o - b->p);
    return 0;
}

/* Bytes the first characters of s take as JSON text, up to max: how many of them fit. */
static Py_ssize_t chars_within(PyObject *s, Py_ssize_t n, size_t max) {
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    size_t used = 0;
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        used += c >= 0x10000 ? 4 : c >= 0x800 ? 3 : c >= 0x80 ? 2 :
                (c >= 0x20 && c != '"' && c != '\\') ? 1 : 6; /* \uXXXX at most */
        if (used > max)
            break;
    }
    return i;
}

/* s as a JSON string of at most about DFT_VALUE_MAX bytes: a longer one keeps what fits and
 * says what was cut (counted). */
static int put_str(dft_buf *b, PyObject *s) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if ((size_t)n * 6 + 2 <= DFT_VALUE_MAX)
        return dft_json_str(b, s);
    Py_ssize_t keep = chars_within(s, n, DFT_VALUE_MAX);
    if (keep == n)
        return dft_json_str(b, s);
    dft_arg_issues[DFT_ARG_CUT]++;
    PyObject *head = PyUnicode_Substring(s, 0, keep);
    PyObject *cut = head ? PyUnicode_FromFormat("%U%s [cut: %zd of %zd characters kept]", head, "\xe2\x80\xa6", keep, n)
                         : NULL;
    Py_XDECREF(head);
    if (!cut)
        return -1;
    int rc = dft_json_str(b, cut);
    Py_DECREF(cut);
    return rc;
}

static int put(dft_buf *b, const char *s, size_t n) {
    if (dft_buf_reserve(b, n) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    dft_buf_put(b, s, n);
    return 0;
}

int dft_json_namecat(dft_buf *b, PyObject *name, PyObject *cat) {
    return put(b, ",\"name\":", 8) < 0 || put_str(b, name) < 0 || put(b, ",\"cat\":", 7) < 0 ||
                   put_str(b, cat) < 0
               ? -1
               : 0;
}

/* Arg values that cannot be written as given, counted per kind (under the GIL):
 * a container nested deeper than DFT_ARGS_DEPTH or holding itself is written
 * as the string "[...]" ("{...}" for a dict), as Python's repr shows a
 * self-reference; a value whose str() raises as "<unprintable TYPE>". */
uint64_t dft_arg_issues[DFT_ARG_KINDS];

/* text (a new reference, or NULL with an error set) as a JSON string; a
 * failed str()/repr() of v is written as "<unprintable TYPE>". Only
 * BaseException-only errors (KeyboardInterrupt from a signal, SystemExit)
 * still propagate. */
static int put_text(dft_buf *b, PyObject *v, PyObject *text) {
    if (!text) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1;
        PyErr_Clear();
        dft_arg_issues[DFT_ARG_UNPRINTABLE]++;
        text = PyUnicode_FromFormat("<unprintable %.100s>", Py_TYPE(v)->tp_name);
        if (!text)
            return -1;
    }
    int rc = put_str(b, text);
    Py_DECREF(text);
    return rc;
}

/* str(obj) as a JSON string: fallback for values JSON has no type for. */
static int put_str_of(dft_buf *b, PyObject *v) {
    return put_text(b, v, PyObject_Str(v));
}

static int put_key(dft_buf *b, PyObject *k) {
    return PyUnicode_Check(k) ? put_str(b, k) : put_str_of(b, k);
}

/* The containers being written around a value, outermost first: the depth
 * is bounded, so is the C recursion. */
typedef struct {
    PyObject *open[DFT_ARGS_DEPTH + 1]; /* + the args dict */
    int depth;
    size_t start; /* where the args' text begins in b */
} json_path;

#define ARGS_CUT "[cut: the args passed 6 MiB]"

/* Whether the args have passed DFT_ARGS_MAX: then the rest of the container in hand is one
 * marker item (counted), after a comma when it follows an item. */
static int args_full(dft_buf *b, json_path *path, int dict, int lead, int *rc) {
    if (b->len - path->start <= DFT_ARGS_MAX)
        return 0;
    dft_arg_issues[DFT_ARG_CUT]++;
    static const char item[] = ",\"\xe2\x80\xa6\"", value[] = ":\"" ARGS_CUT "\"";
    *rc = put(b, item + !lead, sizeof item - 1 - !lead) < 0 ||
          (dict ? put(b, value, sizeof value - 1) : 0) < 0 ? -1 : 0;
    return 1;
}

static int json_value(dft_buf *b, PyObject *v, json_path *path);

/* Items are held while written: a str() they call may change the container. */
static int json_seq(dft_buf *b, PyObject *v, json_path *path) {
    int rc = put(b, "[", 1);
    for (Py_ssize_t i = 0; rc == 0 && i < Py_SIZE(v) && !args_full(b, path, 0, i > 0, &rc); i++) {
        PyObject *item = Py_NewRef(PyList_Check(v) ? PyList_GET_ITEM(v, i) : PyTuple_GET_ITEM(v, i));
        rc = (i && put(b, ",", 1) < 0) ? -1 : json_value(b, item, path);
        Py_DECREF(item);
    }
    return rc < 0 ? -1 : put(b, "]", 1);
}

/* ,"k":v (or "k":v for the first item of a nested dict) for each item. */
static int json_items(dft_buf *b, PyObject *d, json_path *path, int lead) {
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    int rc = 0;
    while (rc == 0 && PyDict_Next(d, &pos, &k, &v) && !args_full(b, path, 1, lead, &rc)) {
        Py_INCREF(k);
        Py_INCREF(v);
        rc = ((lead && put(b, ",", 1) < 0) || put_key(b, k) < 0 || put(b, ":", 1) < 0 ||
              json_value(b, v, path) < 0) ? -1 : 0;
        Py_DECREF(k);
        Py_DECREF(v);
        lead = 1;
    }
    return rc;
}

static int json_dict(dft_buf *b, PyObject *d, json_path *path) {
    return put(b, "{", 1) < 0 || json_items(b, d, path, 0) < 0 ? -1 : put(b, "}", 1);
}

/* A dict or list/tuple inside the args dict; its marker instead when it is
 * nested too deep or inside itself. */
static int json_container(dft_buf *b, PyObject *v, json_path *path, int dict) {
    int kind = path->depth > DFT_ARGS_DEPTH ? DFT_ARG_DEEP : -1;
    for (int i = 0; kind < 0 && i < path->depth; i++)
        if (path->open[i] == v)
            kind = DFT_ARG_CYCLE;
    if (kind >= 0) {
        dft_arg_issues[kind]++;
        return put(b, dict ? "\"{...}\"" : "\"[...]\"", 7);
    }
    path->open[path->depth++] = v;
    int rc = dict ? json_dict(b, v, path) : json_seq(b, v, path);
    path->depth--;
    return rc;
}

static int json_value(dft_buf *b, PyObject *v, json_path *path) {
    char num[32];
    if (v == Py_None)
        return put(b, "null", 4);
    if (v == Py_True)
        return put(b, "true", 4);
    if (v == Py_False)
        return put(b, "false", 5);
    if (PyUnicode_Check(v))
        return put_str(b, v);
    if (PyLong_Check(v)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        /* beyond int64: readers such as dftracer_validate reject the number */
        if (overflow)
            return put_text(b, v, PyLong_Type.tp_repr(v)); /* past 4300 digits repr raises */
        if (x == -1 && PyErr_Occurred())
            return -1;
        return put(b, num, (size_t)(dft_fmt_i64(num, x) - num));
    }
    if (PyFloat_Check(v)) {
        double x = PyFloat_AS_DOUBLE(v);
        /* JSON has no inf/nan; Perfetto (v52) reads a subnormal as 0: both as their text */
        if (!isfinite(x) || (x != 0 && fabs(x) < DBL_MIN))
            return put_str_of(b, v);
        char *s = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (!s)
            return -1;
        if (!strchr(s, 'e') && strspn(s + (*s == '-'), "0123456789.") > 19) {
            /* Perfetto reads more than 18 digits wrong (0.000119... written in
             * full): 17 significant digits in exponent form still round-trip. */
            PyMem_Free(s);
            if (!(s = PyOS_double_to_string(x, 'e', 16, 0, NULL)))
                return -1;
        }
        int rc = put(b, s, strlen(s));
        PyMem_Free(s);
        return rc;
    }
    if (PyDict_Check(v))
        return json_container(b, v, path, 1);
    if (PyList_Check(v) || PyTuple_Check(v))
        return json_container(b, v, path, 0);
    return put_str_of(b, v);
}

int dft_json_fields(dft_buf *b, PyObject *d) {
    if (d == NULL || d == Py_None)
        return 0;
    if (!PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError, "args must be a dict or None, not %.100s", Py_TYPE(d)->tp_name);
        return -1;
    }
    /* the args dict itself is the outermost level */
    json_path path = {.open = {d}, .depth = 1, .start = b->len};
    return json_items(b, d, &path, 1);
}
