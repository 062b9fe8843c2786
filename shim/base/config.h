/* Settings: one table (settings.def), parsed in one place. */
#ifndef PINSHIM_CONFIG_H
#define PINSHIM_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

enum shim_mode { MODE_OFF, MODE_OBSERVE, MODE_PIN, MODE_FULL };
/* PINSHIM_BOUNCE: which large memcpy/memmove calls the copy threads share. */
enum bounce_mode { BOUNCE_OFF, BOUNCE_PINNED, BOUNCE_ALL };

struct shim_config {
    enum shim_mode mode;
    uint64_t min_size;            /* PINSHIM_MIN_SIZE: smallest block tracked and promoted */
    uint64_t budget;              /* PINSHIM_BUDGET, resolved to bytes */
    uint64_t node_budget;         /* PINSHIM_NODE_BUDGET, bytes; 0 = none */
    uint64_t rewrite_min;         /* PINSHIM_REWRITE_MIN: smallest sync copy moved to a shim stream */
    bool rewrite_always;          /* PINSHIM_REWRITE_ALWAYS: also when no other thread copies */
    uint64_t staging_min;         /* PINSHIM_STAGING_MIN: smallest pageable copy sent through staging */
    uint64_t staging_chunk;       /* PINSHIM_STAGING_CHUNK */
    uint64_t staging_buffers;     /* PINSHIM_STAGING_BUFFERS */
    bool staging_taper;           /* PINSHIM_STAGING_TAPER: pieces start and end small */
    uint64_t copy_threads;        /* PINSHIM_COPY_THREADS; 0 = the CPUs local to the GPU */
    bool streaming_stores;        /* PINSHIM_STREAMING_STORES */
    enum bounce_mode bounce;      /* PINSHIM_BOUNCE */
    uint64_t bounce_min;          /* PINSHIM_BOUNCE_MIN */
    uint64_t bw_h2d_pageable;     /* PINSHIM_BW_H2D_PAGEABLE, MB/s */
    uint64_t bw_d2h_pageable;     /* PINSHIM_BW_D2H_PAGEABLE, MB/s */
    uint64_t bw_pinned;           /* PINSHIM_BW_PINNED, MB/s */
    uint64_t reg_cost_resident;   /* PINSHIM_REGISTER_COST, us per GiB of resident pages */
    uint64_t reg_cost_fault;      /* PINSHIM_REGISTER_FAULT_COST, us per GiB of pages not yet touched */
    bool trust_async;             /* PINSHIM_TRUST_ASYNC */
    bool calibrate;               /* PINSHIM_CALIBRATE */
    bool nvtx;                    /* PINSHIM_NVTX */
    uint64_t callsite_min;        /* PINSHIM_CALLSITE_MIN: copies this large always get a call site */
    uint64_t log_level;           /* PINSHIM_LOG: 0 warnings only, 1 info, 2 debug */
    char report[512];             /* PINSHIM_REPORT: "" off, "1" stderr, else a path (%p, %r) */
    char stats[512];              /* PINSHIM_STATS: JSON path (%p, %r); "" off */
    char trace[512];              /* PINSHIM_TRACE: event trace path (%p, %r); "" off */
    uint64_t checked;             /* PINSHIM_CHECKED: checksum of the variables already reported on */
};

extern struct shim_config shim_cfg;

/* Read every setting from the environment; a bad value warns once, naming the variable, and
 * the default is used.  getenv_fn lets unit tests supply their own environment; NULL is the
 * process's own, whose other PINSHIM_* names are then checked too (config_load_env). */
void config_load(const char *(*getenv_fn)(const char *name));
/* The same, and a name of envp (NULL: none) that is not a setting but within a typing slip of
 * one warns once, naming the setting.  No warning at all while PINSHIM_CHECKED equals
 * config_env_checksum of the same environment: someone reported on it already.  Returns the
 * number of problems found (printed or not). */
unsigned config_load_env(const char *(*getenv_fn)(const char *name), char *const *envp);
/* A checksum of what config_load_env looks at: every setting that is set (except
 * PINSHIM_CHECKED) and every other PINSHIM_* entry of envp, in any order. */
uint64_t config_env_checksum(const char *(*getenv_fn)(const char *name), char *const *envp);
/* Check one NAME=VALUE as config_load would read it: 0 when it would be used (an empty value
 * means unset, also valid), -1 for a bad value, -2 when NAME is not a setting; why gets the
 * one-line reason ("PINSHIM_X=\"v\" is not valid (expected ...)", "PINSHIM_Y is not a pinshim
 * setting (did you mean PINSHIM_X?)"). */
int config_check(const char *name, const char *value, char *why, size_t whysz);

/* Parsers, exposed for unit tests.  Return 0 on success, -1 on a bad or overflowing value. */
int config_parse_size(const char *text, uint64_t *out);          /* base 10, K/M/G/T (x1024) */
int config_parse_size_or_percent(const char *text, uint64_t total, uint64_t *out); /* "25%" of total */
int config_parse_uint(const char *text, uint64_t *out);
int config_parse_bool(const char *text, bool *out);               /* 0/1, yes/no, on/off, true/false */
const char *config_mode_name(enum shim_mode m);
const char *config_bounce_name(enum bounce_mode m);

/* Physical memory in bytes (for percentages). */
uint64_t config_physical_memory(void);

/* One line per setting, for the README check: "NAME|default|range|unit|description". */
void config_print_table(int fd);

/* Expand %p (pid) and %r (rank from RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID; "x" when
 * none) in a path template; false when the result does not fit (out is then ""): a cut-short
 * path would name some other file.  %% gives %; any other % sequence is kept as it is. */
bool config_expand_path_checked(const char *tmpl, char *out, size_t outsz);

#endif
