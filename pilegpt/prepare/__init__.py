"""prepare"""
