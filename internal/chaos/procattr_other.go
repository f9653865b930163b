//go:build !linux

package main

import "syscall"

// childAttr: only Linux can make a child die with its parent; elsewhere the suite's clean-up
// stops the workers.
func childAttr() *syscall.SysProcAttr { return nil }
