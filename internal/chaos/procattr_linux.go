package main

import "syscall"

// childAttr makes a child process die with the suite, so a killed run leaves no worker behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
