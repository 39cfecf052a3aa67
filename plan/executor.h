/*
 * executor.h — writes the files of a plan by streaming the parts of every
 * output tensor from the source files, with bounded memory.
 *
 * How bytes move:
 *   - A tensor whose parts are each one contiguous byte range of a source of
 *     the same dtype (replicated tensors, column-parallel slices, fused
 *     blocks) is copied in the kernel with copy_file_range; zero padding is
 *     left as the zeros of a file extended with ftruncate.
 *   - Any other tensor (row-parallel slices, transposes, casts) is built in
 *     slabs of at most EXEC_SLAB_BYTES: contiguous runs of output rows, or
 *     tiles of the last two axes when a part is transposed. Each slab reads
 *     the source bands it needs with pread (at most EXEC_BAND_BYTES at a
 *     time), gathers and converts in memory, and writes with pwrite.
 *   - Threads (default 2) take whole tensors from a shared queue; each holds
 *     one slab and one band buffer, so peak memory is about
 *     threads x (EXEC_SLAB_BYTES + EXEC_BAND_BYTES) whatever the checkpoint.
 *   - Siblings — the tp ranks of one tensor, next to each other in the queue
 *     (same shape and dtype, parts at the same places from the same
 *     sources) — are taken together, up to 16, and built box by box in
 *     shares of one slab: each piece of source a box needs is read once for
 *     all of them (a column slice spans the source's rows for every rank:
 *     read once, not once per rank). Not with O_DIRECT output or CRCs.
 *
 * Every source and output file is open for the whole run; the soft limit on
 * open files is raised towards the hard one when the plan needs more.
 *
 * Output files are created in out_dir (normally a temporary directory that
 * the caller renames into place), headers first, then tensor bytes, then
 * fsync. Writeback is started early (sync_file_range, asynchronous) for the
 * front of a file that is in place, in whole pages, at least
 * EXEC_WRITEBACK_BYTES at a time, so that the fsync finds little left to do
 * and a file of 18,867 small tensors costs a few hundred calls, not one a
 * tensor (nor a page written back half filled, then again). With exec_opts.direct, a long run written from a slab (or from a
 * source made on demand, copied into the slab) goes to the device with
 * O_DIRECT, its whole 4 KiB blocks only: the slab places each box at its
 * file offset's place in a block, and the partial blocks at a run's ends
 * are written through the page cache (a file system that refuses O_DIRECT
 * is written through the page cache alone). Such runs are written by
 * EXEC_WRITERS writer threads: the worker queues its slab with the run and
 * fills a free one from a pool meanwhile (an O_DIRECT write returns only
 * once the device has the bytes); a file is fsynced after its queued
 * writes, and its blocks are allocated up front (fallocate) so that
 * O_DIRECT writes need not take the inode's lock in turn. The sources are
 * read ahead (unless exec_opts.no_prefetch): a thread of its own asks the
 * kernel (posix_fadvise WILLNEED, which starts the reads, and waits only
 * while the device's queue is full) for the source bytes of the tensors
 * after the ones the workers took, up to EXEC_PREFETCH_BYTES ahead, the
 * parts of a tensor (of a group of siblings) sorted and merged into runs
 * per file, so that the ranks' slices of one expert are one request; a part that needs few of the pages it spans (a column
 * slice of rows two pages long or more, as one rank's share) is left to the
 * gather, which reads only its pages. Without it a cold source is read in
 * the pieces the gathers ask for, one request at a time (18,867 experts'
 * row slices, or as many blob files). A source file no byte of which is
 * read twice (no source in it read by two parts or a check: a pull's
 * blobs, a consolidated pull's) is read with O_DIRECT where a whole tensor
 * is copied (from EXEC_DIRECT_READ_MIN bytes; exec_opts.buffered_reads
 * turns it off) instead of copy_file_range: nothing reads those pages
 * again, and the page cache would only have been filled to be emptied.
 * Consolidation plans may carry checks (plan_tensor.checks): pairs of
 * parts that must hold equal bytes; a difference is an error naming the
 * tensor and the check's `what`.
 */
#ifndef CKPT_PLAN_EXECUTOR_H
#define CKPT_PLAN_EXECUTOR_H

#include "format/safetensors.h"
#include "plan/plan.h"

#define EXEC_SLAB_BYTES (8u << 20)
#define EXEC_BAND_BYTES (16u << 20)
/* exec_tensor_read's slabs are smaller: a server holds one per connection,
 * and with exec_slab_cache their size no longer costs re-assembly. */
#define EXEC_READ_SLAB_BYTES (1u << 20)
#define EXEC_MAX_THREADS 64
#define EXEC_WRITERS 2 /* exec_opts.direct: threads writing the workers' slabs */
#define EXEC_HASH_THREADS 2
#define EXEC_HASH_CHUNK (4u << 20)
/* Writeback of an output file is started in runs of whole pages, at least this long. */
#define EXEC_WRITEBACK_BYTES (8u << 20)
#define EXEC_WRITEBACK_ALIGN 4096u

typedef struct {
    char *rel;             /* path relative to the output directory */
    st_layout layout;      /* header and offsets; tensors[i].user indexes `tensors` */
    plan_tensor **tensors; /* not owned */
    size_t ntensors;
} exec_file;

/* Source files that are not on disk: their bytes are made on demand (the
 * zarr arrays of an EasyDeL save, decoded by transform/easydel_import.c).
 * The executor asks such a file for views of byte ranges where it would
 * pread, mmap or copy_file_range a real one; each worker thread has its own
 * state (a decoder, the bytes it decoded last). A plan's checks, hashing and
 * exec_tensor_read do not read them. */
typedef struct exec_vsource {
    void *ctx;
    bool (*serves)(void *ctx, size_t file); /* true for a source file (exec_plan.src_paths index) it makes */
    void *(*thread_open)(void *ctx);        /* a worker's state; NULL: failed, error set */
    void (*thread_close)(void *ctx, void *ts);
    /* *out = bytes [off, off+len) of source file `file` (len <= EXEC_BAND_BYTES),
     * valid until the next call with ts. */
    int (*view)(void *ctx, void *ts, size_t file, uint64_t off, size_t len, const uint8_t **out);
    /* Optional (NULL: not offered): a walk's rows (a transposed tile's
     * source lines): `rows` runs of len bytes, `stride` bytes apart from
     * off (rows * len <= EXEC_BAND_BYTES). *out and *out_stride (bytes, a
     * multiple of the element size): run r is at *out + r * *out_stride,
     * valid until the next call with ts. 1: not served this way (the
     * executor asks view for the span instead). */
    int (*view_rows)(void *ctx, void *ts, size_t file, uint64_t off, uint64_t rows, uint64_t stride, size_t len,
                     const uint8_t **out, uint64_t *out_stride);
    /* Optional (NULL: view and a copy): bytes [off, off+len) of source file
     * `file` into buf (len <= EXEC_SLAB_BYTES). The executor copies a
     * tensor's bytes with it into the slab it writes with O_DIRECT. */
    int (*read)(void *ctx, void *ts, size_t file, uint64_t off, size_t len, uint8_t *buf);
} exec_vsource;

typedef struct {
    const exec_vsource *vsource; /* not owned; NULL: every source file is a file */
    size_t nsrc_paths;
    char **src_paths;     /* source files; plan_source.file indexes these */
    plan_source *sources; /* plan_part.src indexes these */
    size_t nsources;
    exec_file *files;
    size_t nfiles;
    /* Room allocated in src_paths and sources, for builders that append one at
     * a time with ckpt_grow (0 or less than the count: exactly the count). */
    size_t src_paths_cap, sources_cap;
} exec_plan;

typedef struct {
    int threads;       /* 0: 2 */
    bool hash_sources; /* compute sha256 of every source file meanwhile (EXEC_HASH_THREADS threads) */
    bool hash_fresh;   /* ... always reading the bytes: verifying, not identifying (no xattr cache) */
    size_t hash_count; /* ... only the first hash_count source files (0: all) */
    char (*source_sha256)[65]; /* out: nsrc_paths entries when hash_sources */
    bool quiet;        /* no progress lines */
    const char *label; /* progress label */
    bool no_fsync;     /* tests of the executor alone */
    bool largest_first; /* the tensors largest first (rather than in file order): when each costs about its
                           bytes in CPU time (arrays decoded as they are read), the workers finish together */
    bool buffered_reads; /* whole-tensor copies from source files read once through the page cache too
                            (by default they are read with O_DIRECT: ckpt_pread_direct) */
    bool no_prefetch;  /* do not read the sources ahead (posix_fadvise WILLNEED, EXEC_PREFETCH_BYTES ahead of
                          the workers, every part but page-sparse column slices; on by default) */
    bool direct;       /* write the tensors' whole blocks with O_DIRECT where the file system takes it: no
                          page cache filled (nothing reads the output back soon); not with out_sha256 */
    char (*out_sha256)[65]; /* out, when set: sha256 of every output file (nfiles entries), hashed by
                               EXEC_HASH_THREADS threads that trail the writers, reading back what they wrote */
    uint32_t **out_crc32;   /* out, when set: out_crc32[f][slot] is the zip CRC-32 of the bytes of tensor
                               files[f].layout.tensors[slot], taken from each piece as it is written
                               (nothing read back; tensors that would be copied in the kernel are read
                               and written through the slab instead); torch.save zips need them */
} exec_opts;

int exec_run(const exec_plan *p, const char *out_dir, const exec_opts *o);

/* The source byte runs exec_run reads ahead for tensor t (see above): fn(ctx,
 * source file index, lo, hi) for each run [lo, hi) (fn may be NULL); returns
 * their bytes in all. */
typedef void (*exec_run_fn)(void *ctx, size_t file, uint64_t lo, uint64_t hi);
uint64_t exec_prefetch_runs(const exec_plan *p, const plan_tensor *t, exec_run_fn fn, void *ctx);

/* CKPT_EXEC_TRACE=1: a timeline of a run on stderr, one line per event
 * ("ckpt-trace <seconds since the process started> <thread> <event>"):
 * each tensor a worker takes and finishes (wall and CPU time), its waits
 * for a free slab, each writer's busy time, the file's fsync; sources made
 * on demand add their own events (exec_trace). For measuring, not for
 * machines: the lines may change. */
bool exec_tracing(void);
void exec_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Seconds since the process started (CLOCK_MONOTONIC), and the calling
 * thread's CPU seconds. */
double exec_trace_now(void);
double exec_trace_cpu(void);

/* The sha256 of every output file (nfiles entries into out) exactly as
 * exec_run would write it, without writing: each file's header, then its
 * tensors in offset order assembled by exec_tensor_read and hashed, files
 * shared among `threads` threads (plan/exec_hash.c), each with its own state
 * of p->vsource when sources are made on demand (blobs in a bucket). The
 * store needs the hashes of a converted layout it keeps only as recipes. */
int exec_hash_outputs(const exec_plan *p, int threads, const char *label, bool quiet, char (*out)[65]);

/* Lifts the soft limit on open files towards the hard one when `need` files
 * must be open at once (best effort). */
void exec_raise_open_files(size_t need);

/* The indices of l's tensors in the order of their offsets in the file
 * (ntensors + 1 entries, caller frees; NULL: out of memory). */
size_t *exec_offset_order(const st_layout *l);

/* Checks that every source tensor's bytes [offset, offset+nbytes) lie inside
 * its file (src_fds: open descriptors of p->src_paths): a short file would
 * otherwise be read past its end (a bus error through mmap). CKPT_ECORRUPT
 * naming the file and tensor. exec_run does it; exec_tensor_read's callers
 * do it once after opening the files. */
int exec_check_sources(const exec_plan *p, const int *src_fds);

/* What exec_tensor_read assembled last: bytes [a, b) of tensor t, still in
 * the slab. Zeroed before the first read and kept with the slab, it lets
 * reads in sequence (an HTTP body sent in 1 MiB blocks) assemble each slab
 * once instead of once per block. */
typedef struct {
    const plan_tensor *t;
    uint64_t a, b;
    /* The reader's state of p->vsource (its thread_open), which a plan with
     * sources made on demand needs; the caller opens and closes it. */
    void *vts;
} exec_slab_cache;

/* Random access: bytes [off, off+len) of output tensor t, assembled from its
 * parts (src_fds: open descriptors of p->src_paths, -1 for a file p->vsource
 * makes; slab and band: scratch buffers of EXEC_READ_SLAB_BYTES and
 * EXEC_BAND_BYTES; cache: see above, or NULL when no source is made on
 * demand). Used to serve stored files over HTTP without materialising them. */
int exec_tensor_read(const exec_plan *p, const int *src_fds, const plan_tensor *t, uint64_t off, void *buf,
                     size_t len, uint8_t *slab, uint8_t *band, exec_slab_cache *cache);

/* True when the executor copies tensor t as it is, each part one contiguous
 * run of a same-dtype source read front to back (copy_file_range), rather
 * than gathering it slab by slab. */
bool exec_tensor_is_copy(const exec_plan *p, const plan_tensor *t);

/* Bytes of tensor data the plan writes (sum over files). */
uint64_t exec_plan_bytes(const exec_plan *p);
void exec_plan_free(exec_plan *p);

#endif
