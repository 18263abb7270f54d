/* The pod sandbox's pause process for the test node: waits for signals, reaps children, exits on INT/TERM.
   Built static by scripts/node.sh into the image localhost/vramguard-pause (no registry is reachable). */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
  signal(SIGINT, stop); signal(SIGTERM, stop); signal(SIGCHLD, reap);
  for (;;) pause();
}
