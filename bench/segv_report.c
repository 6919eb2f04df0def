/* Where a process crashed, on a machine without a debugger (the GPU machines
 * have none): preloaded, it reports a SIGSEGV, SIGBUS, SIGILL or SIGFPE's
 * faulting address, the instruction's library, nearest exported symbol and
 * offset (dladdr), and the thread's backtrace, then lets the signal kill the
 * process as before.
 *
 *   gcc -O1 -g -shared -fPIC -o .bin/segv_report.so bench/segv_report.c -ldl
 *   LD_PRELOAD=$PWD/.bin/segv_report.so .bin/ficco explore ...
 *
 * Offsets into a stripped library (libcuda) can be resolved on the same
 * machine with `nm -D --defined-only` or read as they are: which library,
 * and how far into it, is most of the answer. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static char alt_stack[1 << 16];

static void say(const char *s) { (void)!write(2, s, strlen(s)); }

static void where(const char *what, void *pc) {
    char line[512];
    Dl_info info;
    if (pc && dladdr(pc, &info) && info.dli_fname) {
        snprintf(line, sizeof line, "segv_report: %s %p in %s+0x%lx (%s+0x%lx)\n", what, pc,
                 info.dli_fname, (unsigned long)((char *)pc - (char *)info.dli_fbase),
                 info.dli_sname ? info.dli_sname : "?",
                 info.dli_saddr ? (unsigned long)((char *)pc - (char *)info.dli_saddr) : 0UL);
    } else {
        snprintf(line, sizeof line, "segv_report: %s %p (no library)\n", what, pc);
    }
    say(line);
}

static void on_signal(int sig, siginfo_t *si, void *ctx) {
    char line[256];
    ucontext_t *uc = (ucontext_t *)ctx;
    void *pc = NULL;
#if defined(__x86_64__)
    pc = (void *)uc->uc_mcontext.gregs[REG_RIP];
#endif
    snprintf(line, sizeof line, "segv_report: signal %d (%s) at address %p, thread %ld, code %d\n",
             sig, strsignal(sig), si->si_addr, (long)syscall(SYS_gettid), si->si_code);
    say(line);
    where("instruction", pc);
    void *frames[64];
    int n = backtrace(frames, 64);
    for (int i = 0; i < n; i++) where("frame", frames[i]);
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    stack_t ss = {.ss_sp = alt_stack, .ss_size = sizeof alt_stack, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
    for (unsigned i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &sa, NULL);
}
