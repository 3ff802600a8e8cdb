// Command pause holds a pod sandbox's namespaces open, as upstream's pause does: it sleeps until SIGTERM or
// SIGINT and then exits 0, and, as PID 1 of a shared PID namespace, reaps the orphans that are handed to it.
// With `-v` it prints its version and exits 0, as upstream's does: kubeadm's upgrade health check runs a Job of
// `pause -v` and waits for it to complete.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && strings.EqualFold(os.Args[1], "-v") {
		fmt.Println("pause (scheduler-patcher's build of the pod sandbox's pause)")
		os.Exit(0)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	children := make(chan os.Signal, 16)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			os.Exit(0)
		case <-children:
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
